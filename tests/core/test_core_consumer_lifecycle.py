"""The core Consumer over time: stopping, sleeping and waking, the extender, a Redis outage.

Every run is bounded: consumers run on threads and are stopped with ``request_stop()``, and
waits poll Redis until a generous deadline instead of sleeping a fixed time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from core_consumer_support import EMPTY, Recorder, Started
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import ManualClock, Message, Queue, QueueSettings, SystemClock
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.waiter import Wake
from django_delayqueue.core.envelope import encode_envelope
from django_delayqueue.core.queue import ANNOUNCE_WITHIN_MS
from django_delayqueue.embedded import RedisServerProcess


@pytest.fixture
def running() -> Iterator[Started]:
    """``running(consumer)`` starts ``consumer.run()`` on a thread, stopped after the test."""
    started = Started()
    yield started
    started.stop_all()


# --- stopping -------------------------------------------------------------------------------------


def test_graceful_stop_finishes_in_flight_and_releases_unstarted(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue(claim_batch=10)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(4)])
    started, proceed = threading.Event(), threading.Event()

    def slow_first(m: Message) -> None:
        started.set()
        assert proceed.wait(TIMEOUT)

    handler = Recorder(slow_first)
    consumer = Consumer([q], handler, grace_seconds=600, idle_seconds=0.1)
    r = running(consumer)
    assert started.wait(TIMEOUT)
    consumer.request_stop()
    proceed.set()
    # Stops once the running handler is done, well before the 600 s grace period.
    assert r.join() == 0
    assert handler.payloads == [0]
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"m1", b"m2", b"m3"]
    assert q.counts() == {**EMPTY, "ready": 3}  # m0 acknowledged, nothing left in flight
    assert not redis_client.hexists(q.keys.messages, "m0")
    assert [(m.id, m.attempt) for m in q.claim(10)] == [("m1", 1), ("m2", 1), ("m3", 1)]


def test_a_stopped_consumer_takes_its_heartbeat_away(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    """Health counts a consumer alive while its heartbeat is fresh: one that stopped (SIGTERM
    is request_stop) must not count for HEALTH_CONSUMER_SECONDS more. Another's stays."""
    q = make_queue()
    redis_client.zadd(q.keys.heartbeats, {"other": q.clock.now_ms()})
    q.schedule("first")
    handled = threading.Event()
    consumer = Consumer([q], lambda m: handled.set(), idle_seconds=0.1, name="leaving")
    r = running(consumer)
    assert handled.wait(TIMEOUT)
    assert redis_client.zscore(q.keys.heartbeats, "leaving") is not None  # it beat once
    consumer.request_stop()
    assert r.join() == 0
    assert redis_client.zrange(q.keys.heartbeats, 0, -1) == [b"other"]


@pytest.mark.parametrize("how", ["second request", "grace over"])
def test_a_stop_never_lets_another_consumer_start_a_running_delivery(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any, running: Any, how: str
) -> None:
    """At a second stop request or the end of the grace period, a handler still running kept
    running while its message was given back for an immediate retry: another consumer could
    start it beside the first. It stays in flight, extended while its handler runs, even once
    run() has returned in a process that goes on (a library caller's): no longer extended, it
    came back after its visibility timeout beside the handler still running. Once the handler
    ends, the visibility timeout brings it back (that attempt counts)."""
    q = make_queue(visibility_timeout=1)  # extended every third of a second
    q.schedule("stuck", id="stuck")
    started, proceed = threading.Event(), threading.Event()

    def stuck(m: Message) -> None:
        started.set()
        proceed.wait(TIMEOUT)

    grace = 600 if how == "second request" else 0
    consumer = Consumer([q], stuck, grace_seconds=grace, idle_seconds=0.1)
    r = running(consumer)
    assert started.wait(TIMEOUT)
    consumer.request_stop()
    if how == "second request":
        consumer.request_stop()
    deadline = lambda: redis_client.zscore(q.keys.unack, "stuck")  # noqa: E731
    try:
        assert r.join() == 0
        assert not proceed.is_set()  # the handler still runs
        # Another consumer finds nothing to start: the message is still in flight.
        assert q.counts() == {**EMPTY, "unack": 1}
        q.promote()
        assert q.claim() == []
        # Long past its visibility timeout, its deadline still moves while the handler runs.
        manual_clock.advance(600)
        wait_until(lambda: deadline() > manual_clock.now_ms())
        assert q.reap().retried == 0
    finally:
        proceed.set()
    # The handler ended: no longer extended (the extender's thread ends), and past its
    # visibility timeout the message is delivered again.
    extender = consumer._extender
    assert extender is not None
    wait_until(lambda: not extender._thread.is_alive())
    manual_clock.advance(2)
    assert q.reap().retried == 1
    manual_clock.advance(600)
    q.promote()
    assert [(m.id, m.attempt) for m in q.claim()] == [("stuck", 2)]


def idle_ends_on_a_nudge_only(consumer: Consumer) -> threading.Event:
    """Make the loop's idle waits end on a nudge alone, never on their timeout: a stop that
    waits on something already finished then never ends, instead of ending a second late.
    The event returned is set when the loop is about to block in such a wait."""
    idle = consumer._waiter.idle
    blocking = threading.Event()

    def only_a_nudge(timeout: float, **kwargs: Any) -> None:
        if not consumer._waiter._nudged and not kwargs:
            blocking.set()
        idle(3600.0, **kwargs)

    consumer._waiter.idle = only_a_nudge  # type: ignore[method-assign]
    return blocking


def test_a_graceful_stop_ends_when_the_last_handler_returns(make_queue: Any, running: Any) -> None:
    """After recording the last outcome, the stopping loop idled for a second with nothing
    left to nudge it (runqueue exited ~1.1 s after its last handler returned)."""
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(2)])
    started, proceed = threading.Semaphore(0), threading.Event()

    def slow(m: Message) -> None:
        started.release()
        assert proceed.wait(TIMEOUT)

    consumer = Consumer([q], slow, concurrency=2, grace_seconds=600, idle_seconds=0.1)
    idle_ends_on_a_nudge_only(consumer)
    r = running(consumer)
    for _ in range(2):
        assert started.acquire(timeout=TIMEOUT)
    consumer.request_stop()
    proceed.set()
    assert r.join() == 0
    assert q.counts() == EMPTY  # both acknowledged


def test_a_second_stop_request_is_not_lost_when_the_waiter_is_busy(
    make_queue: Any, running: Any
) -> None:
    """A signal handler cannot wait for the waiter's lock: when another thread held it (a
    handler finishing, an announcement), the second request's wake-up was dropped and the
    loop slept on until its idle timed out."""
    q = make_queue()
    q.schedule("stuck", id="stuck")
    started, proceed = threading.Event(), threading.Event()

    def stuck(m: Message) -> None:
        started.set()
        proceed.wait(TIMEOUT)

    consumer = Consumer([q], stuck, grace_seconds=600, idle_seconds=0.1)
    idling = idle_ends_on_a_nudge_only(consumer)
    r = running(consumer)
    assert started.wait(TIMEOUT)
    consumer.request_stop()
    assert idling.wait(TIMEOUT)  # the loop waits for the running handler
    held, release = threading.Event(), threading.Event()

    def hold_the_waiters_lock() -> None:
        with consumer._waiter._cond:
            held.set()
            release.wait(TIMEOUT)

    holder = threading.Thread(target=hold_the_waiters_lock)
    holder.start()
    try:
        assert held.wait(TIMEOUT)
        consumer.request_stop()  # its wake-up cannot take the lock
    finally:
        release.set()
        holder.join()
    try:
        assert r.join() == 0
    finally:
        proceed.set()


# --- waiting and waking ---------------------------------------------------------------------------


def test_sleeping_consumer_wakes_for_a_new_message(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock())
    handler = Recorder()
    # Idle and maintenance far beyond the bounded wait below: only the wake message can help.
    consumer = Consumer([q], handler, idle_seconds=3600, maintenance_seconds=3600)
    consumer.announce_within_ms = 3_600_000  # no poll within the wait either
    running(consumer)
    wait_until(lambda: consumer._waiter.subscribed)  # subscribed and sleeping
    q.schedule("hello")
    wait_until(lambda: handler.payloads == ["hello"])


def test_a_long_idle_consumer_still_finds_a_message_too_far_off_to_be_announced(
    make_queue: Any, running: Any
) -> None:
    q = make_queue(clock=SystemClock())
    handler = Recorder()
    # However long idle_seconds is, the consumer reads the pending head within the producers'
    # announce horizon: a message due after it is not announced, yet delivered.
    consumer = Consumer([q], handler, idle_seconds=3600, maintenance_seconds=3600)
    running(consumer)
    wait_until(lambda: consumer._waiter.subscribed)  # subscribed and sleeping
    q.schedule("unannounced", delay=ANNOUNCE_WITHIN_MS / 1000 + 0.5)
    wait_until(lambda: handler.payloads == ["unannounced"])
    assert handler.started_ms[0] >= handler.calls[0].due_ms


def test_sleeping_consumer_wakes_at_the_due_time(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock())
    q.schedule("later", delay=0.3)
    handler = Recorder()
    consumer = Consumer([q], handler, idle_seconds=3600, maintenance_seconds=3600)
    consumer.announce_within_ms = 3_600_000  # no poll either: only the due time can wake it
    running(consumer)
    wait_until(lambda: handler.calls)
    assert handler.started_ms[0] >= handler.calls[0].due_ms


def test_handlers_never_start_before_their_due_time(make_queue: Any, running: Any) -> None:
    # The consumer claims up to one claim lead before a due time: without the handler thread
    # waiting out the rest, the handlers of these messages would start a little early.
    q = make_queue(clock=SystemClock())
    start = q.clock.now_ms() + 200
    q.schedule_many([{"payload": i, "at": start + 7 * i} for i in range(60)])
    handler = Recorder()
    consumer = Consumer([q], handler, idle_seconds=3600, maintenance_seconds=3600)
    running(consumer)
    wait_until(lambda: len(handler.calls) == 60)
    starts = zip(handler.calls, handler.started_ms, strict=True)
    early = [(m.payload, m.due_ms - started) for m, started in starts if started < m.due_ms]
    assert early == []


def test_a_fetch_after_an_early_wake_claims_what_is_due_by_the_time_aimed_at(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    now = manual_clock.now_ms()
    q.schedule("at the target", at=now + 3)
    q.schedule("after it", at=now + 4)
    consumer = Consumer([q], Recorder())
    consumer._plan.aim = Wake(due_ms=now + 3, planned_ms=now + 0.5, announced=False)
    claimed = consumer._plan.fetch()
    assert [m.payload for m in claimed] == ["at the target"]
    assert claimed[0].claimed_ms == now  # the time it was really claimed
    # The aim is used once: the next fetch claims only what is due by the clock.
    q.schedule("also at the target", at=now + 3)
    assert consumer._plan.fetch() == []


def test_a_wake_far_from_its_target_claims_nothing_early(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    now = manual_clock.now_ms()
    q.schedule("an hour off", at=now + 3_600_000)
    consumer = Consumer([q], Recorder())
    # Only a target within the claim lead's bound moves the claim forward (a stop can end a
    # wait long before its target).
    consumer._plan.aim = Wake(due_ms=now + 3_600_000, planned_ms=now, announced=False)
    assert consumer._plan.fetch() == []
    assert q.counts()["pending"] == 1


class CountingQueue(Queue):
    """A real queue that counts the promote and claim calls a consumer plans with it."""

    promotes = 0
    claims = 0

    def promote_call(self, *args: Any, **kwargs: Any) -> Any:
        self.promotes += 1
        return super().promote_call(*args, **kwargs)

    def claim_call(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return super().claim_call(*args, **kwargs)


def test_idle_safety_polls_promote_but_do_not_claim(
    redis_client: redis.Redis, running: Any
) -> None:
    q = CountingQueue(redis_client, "idle", clock=SystemClock())
    consumer = Consumer([q], Recorder(), idle_seconds=0.05, maintenance_seconds=3600)
    running(consumer)
    wait_until(lambda: q.promotes >= 6)
    # The first round claims (nothing was known yet); the safety polls after it only promote.
    assert q.claims == 1


class Maintaining(Consumer):
    refreshes = 0

    def refresh(self) -> None:
        self.refreshes += 1


def sleep_on_the_clock(consumer: Consumer, clock: ManualClock, for_ms: int) -> list[float]:
    """Make ``consumer``'s waits between rounds sleep on the manual ``clock``: each moves the
    clock to the time it was asked to end at, as if nothing happened meanwhile, and returns
    what the waiter would. The first wait once ``for_ms`` have passed (or the 50th: waits that
    end at once would never get there) asks the consumer to stop instead. Returns the list of
    the waits (ms), filled as they happen."""
    start = clock.now_exact_ms()
    waits: list[float] = []

    def wait(due_ms: int | None, poll_ms: int) -> Wake:
        now = clock.now_exact_ms()
        if now - start >= for_ms or len(waits) >= 50:
            consumer.request_stop()
            return Wake(None, now, announced=False, nudged=True)
        lead = consumer._waiter.lead.ms
        woken_for_due = due_ms is not None and due_ms - lead <= poll_ms
        end = due_ms - lead if due_ms is not None and woken_for_due else poll_ms
        waits.append(end - now)
        clock.set(max(now, end))
        return Wake(due_ms if woken_for_due else None, end, announced=False)

    consumer._waiter.wait = wait  # type: ignore[method-assign]
    return waits


def test_an_idle_consumer_makes_one_round_per_maintenance_not_a_burst_around_it(
    redis_client: redis.Redis, manual_clock: ManualClock, running: Any
) -> None:
    q = CountingQueue(redis_client, "idle", clock=manual_clock)
    # Its monotonic clock (maintenance) is the manual one too, out of step with the whole
    # milliseconds of the shared clock, as real ones are.
    consumer = Maintaining(
        [q],
        Recorder(),
        idle_seconds=3600,
        maintenance_seconds=0.2,
        monotonic=lambda: manual_clock.now_exact_ms() / 1000 + 0.0004,
    )
    waits = sleep_on_the_clock(consumer, manual_clock, for_ms=1000)
    assert running(consumer).join() == 0
    # One second of the clock: the first round and one per maintenance, each a maintenance
    # round (it refreshed), none before or after one: every wait lasted a whole period.
    assert q.promotes == consumer.refreshes == 6
    assert len(waits) == 5 and all(wait >= 200 for wait in waits)


def test_an_unannounced_ready_message_is_claimed_after_one_safety_poll(
    redis_client: redis.Redis, running: Any
) -> None:
    q = CountingQueue(redis_client, "idle", clock=SystemClock())
    handler = Recorder()
    consumer = Consumer([q], handler, idle_seconds=0.05, maintenance_seconds=3600)
    running(consumer)
    wait_until(lambda: q.promotes >= 3)
    # Written straight into ready, as an operator's script might: nobody announces it.
    redis_client.hset(q.keys.messages, "quiet", encode_envelope('"quiet"', 1, 1))
    redis_client.rpush(q.keys.ready, "quiet")
    wait_until(lambda: handler.payloads == ["quiet"])


def test_a_safety_poll_that_skips_the_claim_claims_next_round_if_ready_is_not_empty(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    consumer = Consumer([q], Recorder())
    assert consumer._plan.fetch() == []  # ready seen empty
    # Written straight into ready, as an operator's script might: nobody announces it.
    redis_client.hset(q.keys.messages, "quiet", encode_envelope('"quiet"', 1, 1))
    redis_client.rpush(q.keys.ready, "quiet")
    consumer._plan.polling = True  # the next round is an idle safety poll: it skips the claim...
    assert consumer._plan.fetch() == []
    assert consumer._plan.due_now()  # ...but its promote saw the ready message: claim next round
    assert [m.id for m in consumer._plan.fetch()] == ["quiet"]


def test_released_messages_are_announced_to_sleeping_consumers(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("given back")
    [message] = q.claim(1)
    listener = redis_client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(q.keys.wake_channel)
    try:
        wait_until(lambda: listener.get_message(timeout=0.1) is None and listener.subscribed)
        assert q.release(message) == 1
        deadline = time.monotonic() + TIMEOUT
        announcement = None
        while announcement is None and time.monotonic() < deadline:
            announcement = listener.get_message(timeout=0.1)
        assert announcement is not None and announcement["type"] == "message"
    finally:
        listener.close()


# --- the deadline extender ------------------------------------------------------------------------


def test_extender_keeps_a_slow_handler_from_being_redelivered(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any, running: Any
) -> None:
    # Deterministic: the queue's clock only moves when the test says so, and the handler ends
    # when the test lets it. Three visibility timeouts pass on that clock while it runs; each
    # time the extender must have pushed the deadline out before a reap could take it.
    q = make_queue(visibility_timeout=3)
    q.schedule("slow", id="slow")
    started, finish = threading.Event(), threading.Event()

    def slow(m: Message) -> None:
        started.set()
        assert finish.wait(TIMEOUT)

    handler = Recorder(slow)
    r = running(Consumer([q], handler, maintenance_seconds=0.1, idle_seconds=0.1))
    assert started.wait(TIMEOUT)
    for _ in range(3):
        manual_clock.advance(seconds=2)  # the deadline (+3 s) has not passed yet...
        extended = manual_clock.now_ms() + 3000
        # ...and the extender (every 1 s of real time) moves it out again.
        wait_until(lambda at=extended: redis_client.zscore(q.keys.unack, "slow") == at)
        assert q.reap().retried == 0
    finish.set()
    wait_until(lambda: q.counts() == EMPTY)
    r.stop()
    assert [m.attempt for m in handler.calls] == [1]
    assert not redis_client.exists(q.keys.reasons)  # never reaped
    rows = [json.loads(f[b"o"]) for _, f in redis_client.xrange(q.keys.journal)]
    assert [row[6] for batch in rows for row in batch] == ["ack"]  # acknowledged once


# --- a Redis outage -------------------------------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[RedisServerProcess]:
    server = RedisServerProcess().start()
    try:
        yield server
    finally:
        server.stop()


def test_consumer_survives_a_redis_outage(own_server: RedisServerProcess, running: Any) -> None:
    client = redis.Redis.from_url(own_server.url, socket_timeout=2, socket_connect_timeout=1)
    settings = QueueSettings(visibility_timeout=5)
    q = Queue(client, "q", settings=settings, clock=SystemClock())
    handler = Recorder()
    consumer = Consumer([q], handler, idle_seconds=0.2, maintenance_seconds=0.2)
    r = running(consumer)
    q.schedule("before")
    wait_until(lambda: handler.payloads == ["before"])

    own_server.kill()
    time.sleep(1.0)  # let the consumer hit the outage a few times
    assert r.thread.is_alive()
    own_server.restart()
    assert own_server.running

    wait_until(lambda: _try(lambda: q.schedule("after", id="after")))
    wait_until(lambda: "after" in handler.payloads)
    assert r.thread.is_alive()
    wait_until(lambda: q.counts() == EMPTY)
    r.stop()
    assert r.result == 0
    client.close()


def _try(call: Callable[[], Any]) -> bool:
    """True when ``call`` worked; the client may need a moment to reconnect."""
    try:
        call()
    except Exception:
        return False
    return True
