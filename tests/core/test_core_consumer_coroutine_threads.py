"""Threads a coroutine handler starts for its delivery
(core/consumer/handlers/coroutine_threads.py): a delivery stopped at its time limit or by an abort
while work it awaits runs in a thread stays running (extended, not settled) until that work has
ended, so its message is never retried, or dead-lettered and requeued, beside it; a thread still
running a moment after the stop makes the delivery unstoppable, reported as a thread handler's is
(its process replaced).

Each way of awaiting a thread is tried: ``asyncio.to_thread``, ``loop.run_in_executor(None,
...)``, asgiref's ``sync_to_async(thread_sensitive=False)`` and its thread-sensitive default.
The thread waits on an event the test sets; the ledger of events shows the order."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from core_consumer_support import EMPTY
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message
from django_delayqueue.core.clock import SystemClock
from django_delayqueue.core.consumer.handlers import coroutines as handler_coroutines
from django_delayqueue.core.consumer.handlers.coroutine_context import (
    RunningCoroutine,
    current,
    enter,
    hold_for_threads,
)
from django_delayqueue.core.consumer.handlers.coroutine_threads import DeliveryThreads, install
from django_delayqueue.core.consumer.handlers.coroutines import HandlerCoroutines
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler, time_limit_reason
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import ACK, RETRY, Outcome

Work = Callable[[], None]

WAYS: dict[str, Callable[[Work], Awaitable[None]]] = {
    "asyncio.to_thread": lambda work: asyncio.to_thread(work),
    "run_in_executor(None)": lambda work: asyncio.get_running_loop().run_in_executor(None, work),
    "sync_to_async(thread_sensitive=False)": lambda work: sync_to_async(
        work, thread_sensitive=False
    )(),
    "sync_to_async (thread-sensitive)": lambda work: sync_to_async(work)(),
}


class Replaced(Consumer):
    """A consumer that serves on when a handler cannot be stopped (as a supervised child does
    until its successor consumes), noting what it asked to be replaced for."""

    stops_when_replaced = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replacements: list[StoppedHandler] = []

    def replacement_needed(self, stopped: list[StoppedHandler]) -> None:
        self.replacements += stopped


class Ledger:
    """What the handler and its thread did, in order (appended from any thread)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def add(self, what: str, attempt: int) -> None:
        with self._lock:
            self.events.append((what, attempt))

    def has(self, what: str, attempt: int) -> bool:
        with self._lock:
            return (what, attempt) in self.events

    def index(self, what: str, attempt: int) -> int:
        with self._lock:
            return self.events.index((what, attempt))


def _handler(way: str, ledger: Ledger, release: threading.Event) -> Any:
    async def handler(message: Message) -> None:
        attempt = message.attempt
        ledger.add("start", attempt)
        if attempt > 1:
            return  # the retry succeeds at once

        def work() -> None:
            ledger.add("thread start", attempt)
            release.wait(TIMEOUT)
            ledger.add("thread end", attempt)

        try:
            await WAYS[way](work)
        except asyncio.CancelledError:
            ledger.add("cancelled", attempt)
            raise

    return handler


@pytest.mark.parametrize("way", list(WAYS))
def test_a_retry_never_starts_while_the_thread_of_a_timed_out_attempt_runs(
    redis_client: redis.Redis, make_queue: Any, running: Any, monkeypatch: Any, way: str
) -> None:
    monkeypatch.setattr(handler_coroutines, "STOP_WAIT_SECONDS", 0.05)  # reported sooner
    q = make_queue(
        clock=SystemClock(), time_limit=0.2, backoff_base=0.01, backoff_max=0.01, max_attempts=3
    )
    ledger, release = Ledger(), threading.Event()
    consumer = Replaced([q], _handler(way, ledger, release), idle_seconds=0.1)
    running(consumer)
    q.schedule("x", id="m")
    try:
        wait_until(lambda: ledger.has("cancelled", 1), what="the time limit's cancel")
        # Either the retry starts (it must not, while the thread runs) or the delivery is
        # reported as one that could not be stopped: whichever comes first.
        wait_until(lambda: ledger.has("start", 2) or consumer.replacements)
        assert not ledger.has("start", 2), ledger.events
        assert not ledger.has("thread end", 1)
        assert [(s.message_id, s.settlement, s.reason) for s in consumer.replacements] == [
            ("m", "retry", time_limit_reason(0.2))
        ]
        # Still running: in flight (its lease renewed), nothing settled, listed as running.
        assert q.counts() == {**EMPTY, "unack": 1}
        assert [r.message.id for r in consumer.running_handlers()] == ["m"]
    finally:
        release.set()
    # The thread ended: the stop's outcome is recorded (retried), and the retry runs after it.
    wait_until(lambda: q.counts() == EMPTY, what="the retry acknowledged")
    assert ledger.index("thread end", 1) < ledger.index("start", 2)
    assert not ledger.has("start", 3)


@pytest.mark.parametrize("way", list(WAYS))
def test_an_aborted_delivery_is_dead_lettered_only_once_its_thread_ended(
    redis_client: redis.Redis, make_queue: Any, running: Any, monkeypatch: Any, way: str
) -> None:
    monkeypatch.setattr(handler_coroutines, "STOP_WAIT_SECONDS", 0.05)
    q = make_queue(clock=SystemClock(), abort_grace_seconds=0)
    ledger, release = Ledger(), threading.Event()
    consumer = Replaced([q], _handler(way, ledger, release), idle_seconds=0.1)
    running(consumer)
    q.schedule("x", id="m")
    try:
        wait_until(lambda: ledger.has("thread start", 1))
        assert q.abort("m", "by staff")
        wait_until(lambda: ledger.has("cancelled", 1), what="the abort's cancel")
        # Dead-lettered while the thread runs, it could be requeued and run beside it.
        wait_until(lambda: q.counts()["garbage"] or consumer.replacements)
        assert q.counts() == {**EMPTY, "unack": 1}, ledger.events
        assert [(s.message_id, s.settlement, s.reason) for s in consumer.replacements] == [
            ("m", "dead", "aborted: by staff")
        ]
    finally:
        release.set()
    wait_until(lambda: q.counts()["garbage"] == 1, what="the dead letter")
    assert ledger.has("thread end", 1)
    assert redis_client.hget(q.keys.reasons, "m") == b"aborted: by staff"
    assert not ledger.has("start", 2)


def test_a_thread_left_running_by_a_returned_coroutine_holds_its_delivery(
    make_queue: Any, running: Any
) -> None:
    # A coroutine that starts work in a thread and returns without awaiting it: its delivery
    # ends (acknowledged) once that work ended, not before.
    q = make_queue(clock=SystemClock())
    ledger, release = Ledger(), threading.Event()

    async def handler(message: Message) -> None:
        def work() -> None:
            ledger.add("thread start", message.attempt)
            release.wait(TIMEOUT)
            ledger.add("thread end", message.attempt)

        asyncio.get_running_loop().run_in_executor(None, work)
        ledger.add("returned", message.attempt)

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    q.schedule("x", id="m")
    try:
        wait_until(lambda: ledger.has("returned", 1) and ledger.has("thread start", 1))
        assert [r.message.id for r in consumer.running_handlers()] == ["m"]
        assert q.counts() == {**EMPTY, "unack": 1}
        assert consumer.delivered == 0
    finally:
        release.set()
    wait_until(lambda: q.counts() == EMPTY)
    assert consumer.delivered == 1


class AckedBeforeItsThread:
    """A coroutine handler that acknowledges while work it handed to the loop's executor still
    runs, then makes its last thread's release of the held outcome meet its task's done
    callback: the loop, busy in a callback scheduled before that done callback, lets the thread
    end; the thread, between clearing the held outcome and releasing it, waits until the done
    callbacks of the task (the runner's first, then the one added here) have run."""

    def __init__(self) -> None:
        self.thread_may_end = threading.Event()
        self.held_cleared = threading.Event()  # the thread took the held outcome to release it
        self.done_callbacks_ran = threading.Event()

    def runs_async(self, message: Message) -> bool:
        return True

    def time_limits(self, message: Message) -> tuple[float | None, float | None]:
        return None, None

    async def adeliver(self, message: Message) -> Outcome:
        entry = current()
        assert entry is not None and entry.release is not None
        release = entry.release

        def release_once_the_done_callbacks_ran(outcome: Outcome) -> None:
            self.held_cleared.set()
            self.done_callbacks_ran.wait(TIMEOUT)
            release(outcome)

        entry.release = release_once_the_done_callbacks_ran
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, self.thread_may_end.wait, TIMEOUT)  # counted as this one's
        loop.call_soon(self._busy_until_the_thread_ended)  # runs before the done callbacks
        task = asyncio.current_task()
        assert task is not None
        task.add_done_callback(lambda _: self.done_callbacks_ran.set())  # after the runner's
        now_ms = int(time.time() * 1000)
        return Outcome(message, ACK, now_ms, now_ms, None, "")

    def _busy_until_the_thread_ended(self) -> None:
        self.thread_may_end.set()
        self.held_cleared.wait(TIMEOUT)


def test_an_ack_held_for_its_thread_is_not_replaced_by_a_failure_as_the_thread_ends() -> None:
    # The last thread clears the held outcome, then releases it (off the running list) a
    # moment later; the task's done callback, run in that moment, took the delivery for one
    # that never reached its end and released a failure first: the ack was dropped.
    deliverer = AckedBeforeItsThread()
    outcomes: list[Outcome] = []
    first = threading.Event()

    def done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        first.set()

    runner = HandlerCoroutines(deliverer)
    try:
        runner.start(Message("m", "q", None, 0, 0, 1, "1"), done)
        assert first.wait(TIMEOUT)
        assert deliverer.done_callbacks_ran.is_set()
    finally:
        runner.close()  # waits until nothing runs: every outcome given is in
    assert [(o.status, o.reason) for o in outcomes] == [(ACK, "")]


def _entry(released: list[Outcome]) -> RunningCoroutine:
    entry = RunningCoroutine(Message("m", "q", None, 0, 0, 1, "1"), released.append)
    entry.release = released.append
    return entry


def test_work_cancelled_before_it_started_holds_nothing_outside_work_counts_for_nothing() -> None:
    released: list[Outcome] = []
    entry = _entry(released)
    handler_context = contextvars.copy_context()
    handler_context.run(enter, entry)
    pool = DeliveryThreads(max_workers=1)
    busy, release = threading.Event(), threading.Event()
    try:

        def occupy() -> None:
            busy.set()
            release.wait(TIMEOUT)

        first = handler_context.run(pool.submit, occupy)
        queued = handler_context.run(pool.submit, lambda: None)
        assert busy.wait(TIMEOUT)
        outside = pool.submit(lambda: None)  # the consumer's own: not the delivery's
        assert entry.threads == 2
        assert queued.cancel()  # never started: it holds nothing
        assert entry.threads == 1
        ended = Outcome(entry.message, RETRY, 0, 0, None, "time limit exceeded (1 s)")
        assert hold_for_threads(entry, ended)
        assert released == []
        release.set()
        first.result(TIMEOUT)
        wait_until(lambda: released == [ended])  # the last one's end releases it
        outside.result(TIMEOUT)
        assert entry.threads == 0
        assert not hold_for_threads(_entry([]), ended)  # no thread: nothing to hold
    finally:
        release.set()
        pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):  # shut down: the work never runs, nothing is held
        handler_context.run(pool.submit, lambda: None)
    assert entry.threads == 0


def test_the_loop_runs_thread_sensitive_calls_in_its_own_thread_until_it_closes() -> None:
    loop = asyncio.new_event_loop()
    uninstall = install(loop)
    try:
        from asgiref.sync import AsyncToSync

        sensitive = AsyncToSync.loop_thread_executors[loop]
        assert isinstance(sensitive, DeliveryThreads)

        async def names() -> list[str]:
            return list(
                await asyncio.gather(
                    sync_to_async(lambda: threading.current_thread().name)(),
                    asyncio.to_thread(lambda: threading.current_thread().name),
                )
            )

        sensitive_thread, default_thread = loop.run_until_complete(names())
        assert sensitive_thread.startswith("delayqueue-async-sensitive")
        assert default_thread.startswith("delayqueue-async-thread")
    finally:
        uninstall()
        loop.close()
    assert loop not in AsyncToSync.loop_thread_executors
