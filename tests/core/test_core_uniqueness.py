"""Uniqueness windows: ``schedule(..., id=..., unique_for=seconds)``.

A schedule with ``unique_for`` that stores a message opens a window for its id; another schedule
with ``unique_for`` of the id is refused while it is open, whatever became of the first message
(waiting, acknowledged, cancelled). With ``replace=True`` the window spaces replacements out (a
throttle). Time is the injected ManualClock, read by the scripts through their ``now`` argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest
import redis
from memory_support import full

from django_delayqueue.core import ManualClock, PayloadError, Queue
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.errors import ScriptFailed
from django_delayqueue.core.sharding import ShardedQueue, shard_index
from django_delayqueue.core.uniqueness import window_ms_of

T0 = 1_700_000_000_000
DAY = 86_400


def payload(q: Queue, message_id: str) -> object:
    return decode_envelope(q.client.hget(q.keys.messages, message_id))[2]


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms")


def test_a_second_schedule_in_the_window_is_refused_even_after_the_first_was_acked(
    q: Queue, manual_clock: ManualClock
) -> None:
    first = q.schedule({"n": 1}, id="store-7", unique_for=DAY)
    assert (first.created, first.state, first.unique_until_ms) == (True, None, None)
    assert q.client.zscore(q.keys.unique, "store-7") == T0 + DAY * 1000

    waiting = q.schedule({"n": 2}, id="store-7", unique_for=DAY)
    assert (waiting.created, waiting.state, waiting.unique_until_ms) == (
        False,
        "ready",
        T0 + DAY * 1000,
    )
    assert waiting.within_window and not waiting.replaced

    (m,) = q.claim()
    q.ack(m)
    manual_clock.advance(DAY - 1)
    gone = q.schedule({"n": 3}, id="store-7", unique_for=DAY)
    assert (gone.created, gone.state, gone.unique_until_ms) == (False, None, T0 + DAY * 1000)
    assert q.counts()["ready"] == 0  # nothing was stored


def test_the_window_ends_and_the_next_schedule_opens_a_new_one(
    q: Queue, manual_clock: ManualClock
) -> None:
    q.schedule({"n": 1}, id="store-7", unique_for=60)
    (m,) = q.claim()
    q.ack(m)
    manual_clock.advance(60)  # the window is [T0, T0 + 60 s): over at its end
    again = q.schedule({"n": 2}, id="store-7", unique_for=60)
    assert again.created and not again.within_window
    assert q.client.zscore(q.keys.unique, "store-7") == T0 + 120_000
    assert payload(q, "store-7") == {"n": 2}


def test_a_cancelled_message_keeps_its_window(q: Queue) -> None:
    q.schedule({"n": 1}, delay=3600, id="store-7", unique_for=DAY)
    assert q.cancel("store-7") == 1
    refused = q.schedule({"n": 2}, delay=3600, id="store-7", unique_for=DAY)
    assert (refused.created, refused.state, refused.within_window) == (False, None, True)
    assert q.counts()["pending"] == 0
    # A schedule without unique_for does not read windows (nor open one): the way to send again
    # on purpose, e.g. a corrected message after a cancel.
    assert q.schedule({"n": 3}, id="store-7").created
    assert q.client.zscore(q.keys.unique, "store-7") == T0 + DAY * 1000


def test_an_id_held_after_its_window_ended_is_kept_as_without_a_window(
    q: Queue, manual_clock: ManualClock
) -> None:
    q.schedule({"n": 1}, delay=7200, id="x", unique_for=60)
    manual_clock.advance(61)
    kept = q.schedule({"n": 2}, id="x", unique_for=60)
    assert (kept.created, kept.state, kept.within_window) == (False, "pending", False)
    # Not stored, so no window was opened: the old one (over) stays until forgotten.
    assert q.client.zscore(q.keys.unique, "x") == T0 + 60_000


def test_replace_with_a_window_is_a_throttle(q: Queue, manual_clock: ManualClock) -> None:
    q.schedule({"v": 1}, delay=600, id="digest", replace=True, unique_for=30)
    manual_clock.advance(10)
    early = q.schedule({"v": 2}, delay=600, id="digest", replace=True, unique_for=30)
    assert (early.created, early.state, early.unique_until_ms) == (False, "pending", T0 + 30_000)
    assert payload(q, "digest") == {"v": 1}
    manual_clock.advance(20)
    later = q.schedule({"v": 3}, delay=600, id="digest", replace=True, unique_for=30)
    assert (later.created, later.replaced, later.state) == (True, True, "pending")
    assert payload(q, "digest") == {"v": 3}
    assert q.client.zscore(q.keys.unique, "digest") == T0 + 60_000  # counted from this one


def test_replace_with_a_window_of_a_message_in_flight_books_its_successor(q: Queue) -> None:
    q.schedule("first", id="x", unique_for=1)
    (m,) = q.claim()
    q.clock.advance(1)  # type: ignore[attr-defined]
    booked = q.schedule("next", delay=30, id="x", replace=True, unique_for=1)
    assert booked.successor
    q.ack(m)
    assert payload(q, "x") == "next"


def test_windows_that_are_over_are_forgotten_as_new_ones_open(
    q: Queue, manual_clock: ManualClock
) -> None:
    for n in range(10):
        q.schedule(n, id=f"old-{n}", unique_for=1)
    manual_clock.advance(2)
    q.schedule("a", id="new-1", unique_for=1)  # forgets up to 2
    assert q.client.zcard(q.keys.unique) == 9
    q.schedule_many([{"payload": n, "id": f"new-{n}", "unique_for": 1} for n in range(2, 6)])
    assert q.client.zcard(q.keys.unique) == 5  # 10 old - 2 - 8 forgotten + 5 new
    assert set(q.client.zrange(q.keys.unique, 0, -1)) == {f"new-{n}".encode() for n in range(1, 6)}


def test_schedule_many_counts_refusals_in_the_window(q: Queue, manual_clock: ManualClock) -> None:
    q.schedule("x", id="a", unique_for=60)
    (m,) = q.claim()
    q.ack(m)
    result = q.schedule_many(
        [
            {"payload": 1, "id": "a", "unique_for": 60},  # window open: refused
            {"payload": 2, "id": "b", "unique_for": 60},  # new
            {"payload": 3, "id": "b", "unique_for": 60},  # the window item 2 opened
            {"payload": 4, "id": "c"},  # no window: the lean path
            {"payload": 5, "id": "c", "unique_for": 60},  # id taken, no window: a duplicate
            {"payload": 6, "id": "d", "unique_for": -1},  # rejected, named
            {"payload": 7, "id": "b", "unique_for": 60, "replace": True},  # refused too
        ]
    )
    assert (result.scheduled, result.within_window, result.already_present) == (2, 3, 1)
    assert [(r.index, r.id) for r in result.rejected] == [(5, "d")]
    assert "unique_for must be more than 0 seconds" in result.rejected[0].reason
    assert payload(q, "b") == 2
    manual_clock.advance(60)
    replaced = q.schedule_many([{"payload": 8, "id": "b", "unique_for": 60}], replace=True)
    assert (replaced.scheduled, replaced.replaced, replaced.within_window) == (0, 1, 0)
    assert payload(q, "b") == 8


@pytest.mark.parametrize(
    ("unique_for", "message_id", "error"),
    [
        (-5, "x", "unique_for must be more than 0 seconds and finite, not -5"),
        (0, "x", "unique_for must be more than 0 seconds and finite, not 0"),
        (float("nan"), "x", "more than 0 seconds and finite, not nan"),
        (float("inf"), "x", "more than 0 seconds and finite, not inf"),
        ("60", "x", "unique_for must be a number of seconds or a timedelta, not '60' (str)"),
        (True, "x", "not True (bool)"),
        (60, None, "unique_for needs an id"),
        (1e300, "x", "is too long"),
    ],
)
def test_bad_windows_are_refused_with_the_problem_named(
    q: Queue, unique_for: object, message_id: str | None, error: str
) -> None:
    with pytest.raises(PayloadError, match=re.escape(error)):
        q.schedule("x", id=message_id, unique_for=unique_for)  # type: ignore[arg-type]
    assert q.counts()["ready"] == 0


def test_windows_are_whole_milliseconds_rounded_up() -> None:
    assert window_ms_of(timedelta(hours=1), "x") == 3_600_000
    assert window_ms_of(Decimal("0.0001"), "x") == 1
    assert window_ms_of(0.29, "x") == 290
    assert window_ms_of(None, None) == 0


def test_a_sharded_queue_keeps_an_id_s_window_on_the_id_s_shard(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    sharded = ShardedQueue(
        [Queue(redis_client, "sms", shard=i, clock=manual_clock) for i in range(3)]
    )
    ids = [f"store-{n}" for n in range(12)]
    for message_id in ids:
        assert sharded.schedule(message_id, id=message_id, unique_for=60).created
    for m in [m for shard in sharded.shards for m in shard.claim(20)]:
        sharded.shard_for(m.id).ack(m)
    again = sharded.schedule_many([{"payload": 0, "id": i, "unique_for": 60} for i in ids])
    assert (again.scheduled, again.within_window) == (0, 12)
    assert sharded.schedule("x", id="store-3", unique_for=60).within_window
    shard = sharded.shards[shard_index("store-3", 3)]
    assert shard.client.zscore(shard.keys.unique, "store-3") == T0 + 60_000


def test_scheduling_without_a_window_never_touches_the_unique_zset(
    q: Queue, redis_client: redis.Redis
) -> None:
    redis_client.set(q.keys.unique, "not a zset")  # any read or write of it would fail
    assert q.schedule("x", id="a").created
    assert q.schedule("y", id="a", replace=True).replaced
    assert q.schedule_many([{"payload": 1}, {"payload": 2, "id": "b"}]).scheduled == 2


def test_a_wrong_type_unique_key_changes_nothing(q: Queue, redis_client: redis.Redis) -> None:
    redis_client.set(q.keys.unique, "not a zset")
    with pytest.raises(ScriptFailed, match=r"WRONGTYPE key .*:unique holds a string"):
        q.schedule("x", id="a", unique_for=60)
    assert sum(q.counts().values()) == 0


def test_a_full_redis_refuses_windowed_items_and_schedule_many_reports_them(q: Queue) -> None:
    with full(q.client):
        result = q.schedule_many(
            [{"payload": 1, "id": "a", "unique_for": 60}, {"payload": 2, "id": "b"}]
        )
    assert [r.id for r in result.not_scheduled] == ["a", "b"]  # b was not even sent
    assert q.client.exists(q.keys.unique, q.keys.messages) == 0
    assert q.schedule_many([{"payload": 1, "id": "a", "unique_for": 60}]).scheduled == 1


def test_schedule_many_counts_each_window_from_when_it_is_sent(
    q: Queue, manual_clock: ManualClock
) -> None:
    def slow_items():  # type: ignore[no-untyped-def]
        yield {"payload": 0, "id": "a", "unique_for": 60}
        manual_clock.advance(120)  # the iterable took two minutes: a's window would be over
        yield {"payload": 1, "id": "b", "unique_for": 60}

    assert q.schedule_many(slow_items(), chunk_size=1).scheduled == 2
    sent_at = T0 + 120_000
    assert q.client.zscore(q.keys.unique, "b") == sent_at + 60_000
    q.cancel("b")
    assert q.schedule("again", id="b", unique_for=60).within_window


def test_unique_for_without_an_id_is_rejected_in_bulk_sharded_or_not(
    q: Queue, redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    sharded = ShardedQueue(
        [Queue(redis_client, "sharded", shard=i, clock=manual_clock) for i in range(2)]
    )
    items = [{"payload": 0, "id": "a"}, {"payload": 1, "unique_for": 60}, {"payload": 2}]
    for queue in (q, sharded):
        result = queue.schedule_many(items)
        assert [(r.index, r.id) for r in result.rejected] == [(1, None)]
        assert "unique_for needs an id" in result.rejected[0].reason
        assert result.scheduled == 2


def wakes_published_by(q: Queue, send: Callable[[], object]) -> list[bytes]:
    """What ``send`` published on q's wake channel: read up to a marker published after it (a
    channel keeps its order), so no count waits on a timeout."""
    pubsub = q.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(q.keys.wake_channel)
    while pubsub.get_message(timeout=5) is not None:  # the subscribe confirmation
        pass
    send()
    q.client.publish(q.keys.wake_channel, "marker")
    seen: list[bytes] = []
    while (message := pubsub.get_message(timeout=5)) is None or message["data"] != b"marker":
        if message is not None:
            seen.append(message["data"])
    pubsub.close()
    return seen


@pytest.mark.parametrize("replace", [False, True])
def test_a_windowed_bulk_call_publishes_one_wake(q: Queue, replace: bool) -> None:
    items = [{"payload": n, "id": f"m{n}", "unique_for": 60} for n in range(50)]
    items += [{"payload": 0, "id": "later", "unique_for": 60, "delay": 1}]
    assert wakes_published_by(q, lambda: q.schedule_many(items, replace=replace)) == [
        str(T0).encode()  # the earliest: due now
    ]
    assert q.counts()["ready"] == 50


def test_a_windowed_send_once_and_schedule_still_wake_consumers(q: Queue) -> None:
    sent = q.prepare("x", id="once", delay=1)
    assert wakes_published_by(q, lambda: q.send_once(sent, "token-1", unique_ms=60_000)) == [
        str(T0 + 1_000).encode()
    ]
    assert wakes_published_by(q, lambda: q.schedule("y", id="one", unique_for=60)) == [
        str(T0).encode()
    ]
    assert wakes_published_by(q, lambda: q.schedule("z", id="one", unique_for=60)) == []
