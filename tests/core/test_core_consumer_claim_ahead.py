"""What a consumer holds claimed ahead of a free thread is sized by time (issue 37, §1).

Before, a queue whose handlers averaged under 50 ms held a whole claim batch ahead (100 by
default): of two ``runqueue`` processes on a backlog of 20 ms handlers, the first to wake took
101 of 120 messages. Now a queue holds what its threads finish during two refills at their
measured pace (they ask for more once half is left). Durations come from the outcomes (the
consumer's clock) and refills from a manual clock: nothing here depends on how fast the
machine is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from core_consumer_support import EMPTY, threads_alone
from waiting import wait_until

from django_delayqueue.core import ManualClock, Message
from django_delayqueue.core.consumer.handlers.threads import HandlerThreads
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import ACK, Outcome
from django_delayqueue.core.consumer.rounds.claim_ahead import ClaimAhead

BATCH = 100  # the default claim_batch


class Monotonic:
    """A monotonic clock (seconds) that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ran_for(ms: int) -> Callable[[Message], Outcome]:
    """Threads' work: each message's handler ran ``ms`` milliseconds by the consumer's clock."""
    return lambda m: Outcome(m, ACK, 0, ms)


def run_through(threads: HandlerThreads, count: int, first: int = 0) -> None:
    """Hand ``count`` messages to ``threads`` and wait until every one has finished."""
    messages = [
        Message(f"m{i}", "q", None, 0, 0, 1, str(i), 0) for i in range(first, first + count)
    ]
    threads.add(messages)
    done: list[Outcome] = []
    wait_until(lambda: done.extend(threads.take_finished()) or len(done) == count, every=0.002)


@pytest.mark.parametrize(
    ("handler_ms", "refill_ms", "threads", "ahead"),
    [
        (20, 2, 1, 1),  # a 20 ms handler: one ahead covers two refills
        (20, 15, 1, 2),  # a refill slowed down (say, waiting for the GIL): two
        (20, 30, 1, 3),
        (20, 2, 8, 2),  # eight threads finish 0.8 messages during a refill
        (2, 2, 1, 2),
        (1, 3, 4, 24),
        (0.05, 3, 1, BATCH),  # a no-op handler: a claim batch, at most
        (0.2, 3, 1, 30),
        (0, 0, 1, BATCH),  # quicker than the clock reads
        (1000, 2, 8, 0),  # a refill is nothing beside a slow handler: hold none
        (200, 2, 1, 0),
    ],
)
def test_what_is_held_ahead_covers_one_refill_at_the_handlers_pace(
    handler_ms: float, refill_ms: float, threads: int, ahead: int
) -> None:
    pace = ClaimAhead()
    assert pace.count(threads, BATCH) == 0  # nothing measured yet: one per thread
    pace.handler_ran(handler_ms / 1000)
    pace.refilled(refill_ms / 1000)
    assert pace.count(threads, BATCH) == ahead


def test_handlers_quicker_than_the_clock_reads_hold_a_claim_batch() -> None:
    """Outcomes of 0 ms after one of 1 ms: a mean that decays toward 0 (a denormal float, its
    quotient infinite) is a claim batch, not an OverflowError in the handler threads."""
    pace = ClaimAhead()
    pace.handler_ran(0.001)
    pace.refilled(0.002)
    for _ in range(5000):
        pace.handler_ran(0.0)
    mean = pace.handler_seconds
    assert mean is not None and 0.0 < mean < 1e-300  # stuck on the smallest float above 0
    assert pace.count(1, BATCH) == BATCH


def test_one_slow_run_keeps_a_quick_queues_claim_batch_and_a_lasting_change_shows() -> None:
    """A no-op handler that once measured 5 ms (its thread waited for the GIL while the loop
    read a claim) does not cut what its queue holds for the next dozens of runs; handlers that
    now take 20 ms each are held for as such within 40 runs."""
    pace = ClaimAhead()
    pace.refilled(0.002)
    for _ in range(50):
        pace.handler_ran(0.0)
    pace.handler_ran(0.005)
    assert pace.count(1, BATCH) == BATCH
    for _ in range(40):
        pace.handler_ran(0.020)
    assert pace.count(1, BATCH) == 1


def test_threads_of_20ms_handlers_hold_one_ahead_not_a_claim_batch() -> None:
    """The claim the loop makes for one thread of 20 ms handlers: itself and one more (before:
    itself and a claim batch, whatever the pace)."""
    threads = threads_alone(1, ran_for(20))
    try:
        assert threads.room(BATCH) == 1  # nothing measured: one per thread
        run_through(threads, 3)
        assert threads.room(BATCH) == 2
    finally:
        threads.close()


def test_threads_of_no_op_handlers_still_hold_a_claim_batch_ahead() -> None:
    threads = threads_alone(1, ran_for(0))
    try:
        run_through(threads, 3)
        assert threads.room(BATCH) == 1 + BATCH  # a no-op queue keeps its speed
    finally:
        threads.close()


def test_threads_of_slow_handlers_hold_none_ahead() -> None:
    threads = threads_alone(2, ran_for(1000))
    try:
        run_through(threads, 2)
        assert threads.room(BATCH) == 2
    finally:
        threads.close()


def test_a_slow_refill_is_measured_and_held_for() -> None:
    """Threads that asked for more (a handler finished) wait until the round that answers
    hands messages over: that wait, on the loop's clock, sets how many they hold ahead."""
    clock = Monotonic()
    threads = threads_alone(1, ran_for(20), monotonic=clock)
    try:
        run_through(threads, 3)  # they asked at 1000.0 (the clock has not moved)
        clock.now += 0.030  # a refill of 30 ms: longer than a handler
        threads.refilled(round_started=1000.0)
        assert threads.room(BATCH) == 1 + 3
        # A round that started before the threads asked does not answer them: no sample.
        run_through(threads, 1, first=3)  # asked at 1000.030
        clock.now += 5.0
        threads.refilled(round_started=1000.0)
        assert threads.room(BATCH) == 1 + 3
        # A failed round (then a backoff) drops the request: the outage is not timed.
        threads.refilled(round_started=None)
        threads.refilled(round_started=clock.now)
        assert threads.room(BATCH) == 1 + 3
    finally:
        threads.close()


def test_two_consumers_share_a_backlog_of_20ms_handlers_evenly(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    """Two consumers of one queue (concurrency 1, the default claim batch) take turns as their
    threads free up, each round trip 2 ms long on its own clock: each claims for itself and one
    more, and the backlog splits evenly. Before, the second round of the first to measure its
    handlers claimed a whole claim batch: 39 of 40 messages."""
    count = 40
    q = make_queue(concurrency=1)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(count)])
    ran: dict[str, int] = {"a": 0, "b": 0}
    lock = threading.Lock()

    def handler_of(name: str) -> Callable[[Message], None]:
        def handle(m: Message) -> None:
            threading.Event().wait(0.02)  # 20 ms of work (its length is measured, not asserted)
            with lock:
                ran[name] += 1

        return handle

    clocks = {name: Monotonic() for name in ran}
    consumers = {name: Consumer([q], handler_of(name), monotonic=clocks[name]) for name in ran}
    claimed = dict.fromkeys(ran, 0)
    try:
        while sum(claimed.values()) < count:
            for name, consumer in consumers.items():
                clocks[name].now += 0.002  # this round trip's length on its clock
                claimed[name] += consumer.step()
                wait_until(lambda name=name: ran[name] == claimed[name], every=0.002)
        for consumer in consumers.values():  # the last outcomes recorded
            consumer.step()
        wait_until(lambda: q.counts() == EMPTY)
    finally:
        for consumer in consumers.values():
            consumer._threads.close()
    assert ran == claimed
    assert sum(ran.values()) == count
    # An even split: they alternate, each taking at most two at a time.
    assert abs(ran["a"] - ran["b"]) <= 2, ran
