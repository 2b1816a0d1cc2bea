"""Recurring schedules kept by real consumers on a real Redis, on a clock the test moves.

The clock is a ManualClock shared by every consumer: the test moves it one tick at a time and
waits (on events, not sleeps) until what that instant must cause has happened.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
import redis
from core_consumer_support import T0, Started, keeper_rounds
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message, Queue
from django_delayqueue.core.clock import ManualClock
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper, parse_tick_id
from django_delayqueue.core.scripts.calls import ScriptBatch


@pytest.fixture
def running() -> Any:
    started = Started()
    yield started
    started.stop_all()


class Ticks:
    """A handler that records each tick's instant, per consumer, and can be made to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[str, int, int]] = []  # (schedule, instant ms, attempt)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def __call__(self, message: Message) -> None:
        parsed = parse_tick_id(message.id)
        assert parsed is not None, message.id
        assert parsed[1] == message.due_ms  # the tick carries its intended instant
        with self.changed:
            self.seen.append((parsed[0], parsed[1], message.attempt))
            self.changed.notify_all()
        if self.fail:
            raise RuntimeError("the report server is down")

    def instants(self, name: str | None = None) -> list[int]:
        with self.lock:
            return [t for n, t, _ in self.seen if name is None or n == name]

    def wait_for(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.seen) >= count, TIMEOUT), self.seen


def consumer(q: Queue, handler: Any, schedules: list[Recurrence], **kw: Any) -> Consumer:
    own = Queue(q.client, q.name, settings=q.settings, clock=q.clock)  # as another process
    keeper = ScheduleKeeper()
    keeper.set_definitions(schedules, [own], kw.pop("version", 0))
    return Consumer([own], handler, idle_seconds=0.05, keeper=keeper, **kw)


def test_three_consumers_race_for_100_ticks_and_each_runs_once(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    every = Recurrence("heartbeat-report", "reports", every=1, payload={"kind": "beat"})
    ticks = Ticks()
    for _ in range(3):
        running(consumer(q, ticks, [every]))
    first = (T0 // 1000 + 1) * 1000  # the first whole second after the schedule appeared
    wait_until(lambda: redis_client.zscore(q.keys.pending, every.tick_id(first)) is not None)
    for n in range(100):
        manual_clock.set(first + n * 1000)
        ticks.wait_for(n + 1)
    assert ticks.instants() == [first + n * 1000 for n in range(100)]  # in order, none twice
    # The next tick is already waiting, created exactly once.
    wait_until(lambda: redis_client.zscore(q.keys.pending, every.tick_id(first + 100_000)))
    assert redis_client.zcard(q.keys.pending) == 1


def test_a_failing_tick_never_stops_its_schedule(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("payments", max_attempts=1)
    every = Recurrence("stuck-payments", "payments", every=300)
    ticks = Ticks(fail=True)
    running(consumer(q, ticks, [every]))
    first = (T0 // 300_000 + 1) * 300_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, every.tick_id(first)) is not None)
    for n in range(3):
        manual_clock.set(first + n * 300_000)
        ticks.wait_for(n + 1)
    assert ticks.instants() == [first, first + 300_000, first + 600_000]
    wait_until(lambda: q.counts()["garbage"] == 3)  # each failure is a dead letter of its own


@pytest.mark.parametrize(
    ("policy", "expected_missed"),
    [("latest", [9]), ("all", [1, 2, 3, 4, 5, 6, 7, 8, 9]), ("none", [])],
)
def test_catch_up_policies_after_every_consumer_was_down(
    make_queue: Any,
    manual_clock: ManualClock,
    running: Any,
    redis_client: redis.Redis,
    policy: str,
    expected_missed: list[int],
) -> None:
    q = make_queue("reports")
    minute = 60_000
    schedule = Recurrence("digest", "reports", every=60, catch_up=policy)  # type: ignore[arg-type]
    first = (T0 // minute + 1) * minute
    ticks = Ticks()
    r = running(consumer(q, ticks, [schedule]))
    wait_until(lambda: redis_client.zscore(q.keys.pending, schedule.tick_id(first)) is not None)
    manual_clock.set(first)
    ticks.wait_for(1)
    wait_until(lambda: redis_client.zscore(q.keys.pending, schedule.tick_id(first + minute)))
    r.stop()
    # Every consumer down from just after tick 0 to 9.5 minutes later: ticks 1..9 missed
    # (tick 1 was waiting, created before the outage; the policy decides for it too).
    manual_clock.set(first + 9 * minute + 30_000)
    ticks2 = Ticks()
    running(consumer(q, ticks2, [schedule]))
    expected = expected_missed
    wait_until(lambda: redis_client.zscore(q.keys.pending, schedule.tick_id(first + 10 * minute)))
    ticks2.wait_for(len(expected))
    # Everything but the next tick acknowledged or withdrawn: no other tick can still come.
    wait_until(lambda: redis_client.hlen(q.keys.messages) == 1)
    assert sorted(ticks2.instants()) == [first + n * minute for n in expected]
    manual_clock.set(first + 10 * minute)
    ticks2.wait_for(len(expected) + 1)
    assert ticks2.instants()[-1] == first + 10 * minute


def test_an_edited_schedule_replaces_its_waiting_tick_and_a_deleted_one_withdraws_it(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    old = Recurrence("report", "reports", every=3600, payload={"v": 1})
    ticks = Ticks()
    c = consumer(q, ticks, [old])
    running(c)
    hour = 3_600_000
    old_first = (T0 // hour + 1) * hour
    wait_until(lambda: redis_client.zscore(q.keys.pending, old.tick_id(old_first)))
    new = Recurrence("report", "reports", every=60, payload={"v": 2})
    c.keeper.set_definitions([new], c.queues, 1)  # type: ignore[union-attr]
    manual_clock.advance(ms=100)  # a consumer's wait ends when its clock moves
    new_first = (T0 // 60_000 + 1) * 60_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, new.tick_id(new_first)))
    wait_until(lambda: redis_client.zscore(q.keys.pending, old.tick_id(old_first)) is None)
    assert not redis_client.hexists(q.keys.messages, old.tick_id(old_first))
    manual_clock.set(new_first)
    ticks.wait_for(1)
    assert ticks.instants() == [new_first]
    c.keeper.set_definitions([], c.queues, 2)  # type: ignore[union-attr]
    manual_clock.advance(ms=100)
    wait_until(lambda: redis_client.hget(q.keys.recurrence_states, "report") == b"0 deleted 2")
    assert q.counts()["pending"] == 0  # the waiting tick was withdrawn
    assert redis_client.zcard(q.keys.ticks) == 0


def test_a_consumer_behind_on_the_definitions_does_not_undo_an_edit(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    old = Recurrence("report", "reports", every=3600)
    new = Recurrence("report", "reports", every=60)
    ahead = consumer(q, Ticks(), [new], version=2)
    behind = consumer(q, Ticks(), [old], version=1)
    running(ahead)
    running(behind)
    new_first = (T0 // 60_000 + 1) * 60_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, new.tick_id(new_first)))
    for _ in range(3):  # rounds of both: the state stays the newer definition's
        behind.keeper.refresh()  # type: ignore[union-attr]
        manual_clock.advance(ms=100)
        wait_until(lambda: not behind.keeper.needs_round(manual_clock.now_ms()))  # type: ignore[union-attr]
    assert redis_client.zrange(q.keys.pending, 0, -1) == [new.tick_id(new_first).encode()]
    state = redis_client.hget(q.keys.recurrence_states, "report")
    assert state is not None and state.endswith(b" 2")  # type: ignore[arg-type]


def test_a_tick_s_last_run_and_outcome_are_recorded(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("payments", max_attempts=1)
    every = Recurrence("stuck-payments", "payments", every=300)
    ticks = Ticks(fail=True)
    running(consumer(q, ticks, [every]))
    first = (T0 // 300_000 + 1) * 300_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, every.tick_id(first)) is not None)
    manual_clock.set(first)
    ticks.wait_for(1)
    run = wait_until(lambda: redis_client.hget(q.keys.tick_runs, "stuck-payments"))
    import json

    assert json.loads(run) | {"finished": 0} == {
        "tick": first,
        "finished": 0,
        "outcome": "garbage",
        "error": "RuntimeError",
    }
    assert Counter(o for _, _, o in ticks.seen) == Counter({1: 1})


def test_a_tick_that_finishes_after_its_schedule_was_deleted_leaves_no_last_run(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    beat = Recurrence("beat", "reports", every=60)
    started, release = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        started.set()
        assert release.wait(TIMEOUT)

    running(consumer(q, handler, [beat], version=1))
    first = (T0 // 60_000 + 1) * 60_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, beat.tick_id(first)))
    manual_clock.set(first)
    assert started.wait(TIMEOUT)
    # Deleted in the admin (version 2 has no "beat") while its tick runs.
    deleter = ScheduleKeeper()
    deleter.set_definitions([], [q], 2)
    keeper_rounds(deleter, [q], redis_client, manual_clock.now_ms())
    assert (redis_client.hget(q.keys.recurrence_states, "beat") or b"").startswith(b"0 deleted ")
    release.set()
    # The run is recorded before its ack (write_soon), so once the tick is gone it was sent.
    wait_until(lambda: not redis_client.hexists(q.keys.messages, beat.tick_id(first)))
    assert not redis_client.hexists(q.keys.tick_runs, "beat")


def test_a_schedule_that_cannot_make_its_tick_never_holds_up_the_queue(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    big = Recurrence("big", "reports", every=60, payload={"blob": "x" * 200})
    ticks, orders = Ticks(), threading.Event()

    def handler(message: Message) -> None:
        if message.payload == {"order": 1}:
            orders.set()
        else:
            ticks(message)

    c = consumer(q, handler, [big])
    running(c)
    first = (T0 // 60_000 + 1) * 60_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, big.tick_id(first)))
    # Its next tick will not fit any more (as if the limit were lowered in the admin).
    (own,) = c.queues
    own.settings = own.settings.replace(max_payload_bytes=64)
    manual_clock.set(first)
    ticks.wait_for(1)  # the tick made before still runs
    q.schedule({"order": 1})  # and ordinary messages are still delivered
    assert orders.wait(TIMEOUT)
    keeper = c.keeper
    assert keeper is not None
    wait_until(lambda: (due := keeper.next_due()) is not None and due > manual_clock.now_ms())
    assert redis_client.zcard(q.keys.pending) == 0  # no next tick: it could not be encoded


def test_a_schedule_another_release_published_is_left_alone_not_taken_for_deleted(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    beat = Recurrence("beat", "reports", every=60)
    newer = consumer(q, Ticks(), [beat], version=7)
    running(newer)
    first = (T0 // 60_000 + 1) * 60_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, beat.tick_id(first)))
    older = ScheduleKeeper()  # same version, but it could not read "beat"'s options
    older.set_definitions([], [q], 7, unreadable=["beat"])
    keeper_rounds(older, [q], redis_client, manual_clock.now_ms())
    assert redis_client.zscore(q.keys.pending, beat.tick_id(first))  # still waiting
    assert not redis_client.hget(q.keys.recurrence_states, "beat").startswith(b"0 deleted")  # type: ignore[union-attr]


def test_a_broken_last_runs_key_stops_no_schedule(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    redis_client.set(q.keys.tick_runs, "not a hash")  # display only: recording its run fails
    beat = Recurrence("beat", "reports", every=60)
    ticks = Ticks()
    running(consumer(q, ticks, [beat]))
    first = (T0 // 60_000 + 1) * 60_000
    for n in range(3):
        wait_until(
            lambda n=n: redis_client.zscore(q.keys.pending, beat.tick_id(first + n * 60_000))
        )
        manual_clock.set(first + n * 60_000)
        ticks.wait_for(n + 1)
    assert ticks.instants() == [first, first + 60_000, first + 120_000]


def test_an_unreadable_reply_never_escapes_the_keeper(make_queue: Any) -> None:
    q = make_queue("reports")
    keeper = ScheduleKeeper()
    keeper.set_definitions([Recurrence("beat", "reports", every=60)], [q])
    entries = keeper.add_to(ScriptBatch(), [q], T0)
    keeper.read(entries, [[b"beat"]], T0)  # an odd-length HGETALL: nonsense
    keeper.read(entries, [None], T0)
    assert not keeper.needs_round(T0)  # left alone for a while...
    assert keeper.needs_round(T0 + 60_000)  # ...then read again


def _follow(
    q: Queue, clock: ManualClock, ticks: Ticks, name: str, count: int, client: redis.Redis
) -> list[str]:
    """Jump the clock to each next tick the consumers created, and wait for it to run."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    for n in range(count):
        waiting = wait_until(
            lambda: [
                p[1]
                for m in client.zrange(q.keys.pending, 0, -1)
                if (p := parse_tick_id(m.decode())) and p[0] == name
            ]
        )
        clock.set(min(waiting))
        ticks.wait_for(n + 1)
    berlin = ZoneInfo("Europe/Berlin")
    return [datetime.fromtimestamp(t / 1000, berlin).isoformat() for t in ticks.instants(name)]


def test_consumers_keep_a_berlin_cron_through_spring_forward_and_fall_back(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis
) -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    q = make_queue("reports")
    nightly = Recurrence("nightly", "reports", cron="30 2 * * *", timezone="Europe/Berlin")
    manual_clock.set(datetime(2026, 3, 28, 12, tzinfo=berlin).timestamp() * 1000)
    ticks = Ticks()
    for _ in range(2):
        running(consumer(q, ticks, [nightly]))
    assert _follow(q, manual_clock, ticks, "nightly", 2, redis_client) == [
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night: once, at 03:00
        "2026-03-30T02:30:00+02:00",
    ]
    q2 = make_queue("hourly-reports")
    hourly = Recurrence("hourly", "hourly-reports", cron="0 * * * *", timezone="Europe/Berlin")
    manual_clock.set(datetime(2026, 10, 25, 0, 30, tzinfo=berlin).timestamp() * 1000)
    ticks2 = Ticks()
    for _ in range(2):
        running(consumer(q2, ticks2, [hourly]))
    assert _follow(q2, manual_clock, ticks2, "hourly", 4, redis_client) == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the repeated hour is an hour later: it runs, once
        "2026-10-25T03:00:00+01:00",
    ]


@pytest.mark.parametrize("policy", ["none", "latest"])
def test_a_late_round_of_a_running_consumer_skips_nothing(
    make_queue: Any, manual_clock: ManualClock, running: Any, redis_client: redis.Redis, policy: str
) -> None:
    """Missed means no consumer ran: a round 5 s late (a Redis blip's backoff, a stuck refresh)
    still delivers the tick, whatever catch_up says."""
    q = make_queue("reports")
    every = Recurrence("digest", "reports", every=60, catch_up=policy)  # type: ignore[arg-type]
    ticks = Ticks()
    running(consumer(q, ticks, [every]))
    first = (T0 // 60_000 + 1) * 60_000
    wait_until(lambda: redis_client.zscore(q.keys.pending, every.tick_id(first)))
    manual_clock.set(first + 5_000)
    ticks.wait_for(1)
    assert ticks.instants() == [first]


def test_a_keeper_from_the_settings_file_alone_deletes_nothing(
    make_queue: Any, manual_clock: ManualClock, redis_client: redis.Redis
) -> None:
    q = make_queue("reports")
    redis_client.hset(q.keys.recurrence_states, "by-staff", f"{T0 + 60_000} abc 1700000000000")
    keeper = ScheduleKeeper()  # the published schedules and the rows were unavailable
    keeper.set_definitions([], [q], 0, authoritative=False)
    keeper_rounds(keeper, [q], redis_client, T0)
    assert (
        redis_client.hget(q.keys.recurrence_states, "by-staff")
        == f"{T0 + 60_000} abc 1700000000000".encode()
    )
