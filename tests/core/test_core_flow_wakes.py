"""Consumers waiting on a queue's ``max_in_flight`` are woken whenever a slot frees, on every
path that ends a message (core/consumer/rounds/flow_holds.py): a round, a consumer stopping, the
supervisor settling a stopped handler, a reap; and the claim keeps the flag the wake reads
while others still wait. Each wake is read off the queue's wake channel: it is published
before the call under test returns, so reading it waits for nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from waiting import TIMEOUT

from django_delayqueue.core import ManualClock, Message, Queue
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler, settle_stopped
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.round_trip import RoundTrip

Capped = tuple[Queue, Message]


@pytest.fixture
def capped(make_queue: Callable[..., Queue]) -> Capped:
    """A queue capped at one in flight: its slot taken, a second message waiting on it."""
    q = make_queue(max_in_flight=1)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(2)])
    (message,) = q.claim(2)
    assert q.client.hget(q.keys.limiter, "held") == b"in_flight"
    return q, message


@pytest.fixture
def woken(redis_client: redis.Redis, capped: Capped) -> Iterator[Callable[[], bool]]:
    """Whether the capped queue's wake channel carried a wake since the last question."""
    pubsub = redis_client.pubsub()
    pubsub.subscribe(capped[0].keys.wake_channel)
    assert pubsub.get_message(timeout=TIMEOUT)["type"] == "subscribe"

    def ask() -> bool:
        message = pubsub.get_message(timeout=1)
        return message is not None and message["type"] == "message"

    yield ask
    pubsub.close()


def test_a_consumer_stopping_wakes_those_waiting_on_the_cap(
    capped: Capped, woken: Callable[[], bool]
) -> None:
    q, message = capped
    consumer = Consumer([q], lambda m: None)
    try:
        # Its outcome left to record at the stop (record_left's path), not by a round.
        consumer._unrecorded.extend([consumer.deliver(message)])
        consumer._round_trip.record_only(q.clock.now_ms(), force=True)
        assert q.counts()["unack"] == 0
        assert woken()
    finally:
        consumer._threads.close()
        consumer._waiter.close()


def test_the_supervisor_settling_a_stopped_handler_wakes_them(
    capped: Capped, woken: Callable[[], bool]
) -> None:
    q, message = capped
    item = StoppedHandler.of(message, "retry", "time limit")
    assert settle_stopped({q.name: q}, [item]) == [1]
    assert woken()


def test_a_reap_of_timed_out_deliveries_wakes_them(
    capped: Capped, woken: Callable[[], bool], manual_clock: ManualClock
) -> None:
    q, _ = capped
    manual_clock.advance(seconds=q.settings.visibility_timeout + 1)
    now = manual_clock.now_ms()
    assert RoundTrip._log_reaped(q, q.reap_call(now).run(q.client))
    assert q.counts()["unack"] == 0
    assert woken()


def test_a_claim_that_takes_the_last_slot_keeps_the_hold_for_the_others(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue(max_in_flight=2)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(5)])
    first = q.claim(5)
    assert len(first) == 2 and q.client.hget(q.keys.limiter, "held") == b"in_flight"
    q.ack(first[0])
    # A consumer with room for one takes the freed slot: it got all it wanted, but the cap is
    # full again and three wait: the flag stays, so the next freed slot wakes the others.
    assert len(q.claim(1)) == 1
    assert q.client.hget(q.keys.limiter, "held") == b"in_flight"
    q.ack(first[1])
    q.client.delete(q.keys.unack)  # every slot free: a claim of one leaves one free
    assert len(q.claim(1)) == 1
    assert q.client.hget(q.keys.limiter, "held") is None
