"""The watchdog (core/consumer/limits/watchdog.py): soft and hard time limits, and a handler that
cannot be stopped, on real threads with a clock the test moves; then inside a running Consumer;
then a coroutine's run, kept by the same watchdog.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message, QueueSettings, SystemClock
from django_delayqueue.core.consumer.handlers.coroutine_context import RunningCoroutine
from django_delayqueue.core.consumer.handlers.coroutines import HandlerCoroutines
from django_delayqueue.core.consumer.handlers.loop_liveness import (
    BLOCKED_WARN_SECONDS,
    PING_SECONDS,
    LoopLiveness,
)
from django_delayqueue.core.consumer.limits.runs import Run, Runs
from django_delayqueue.core.consumer.limits.stopped import (
    StoppedHandler,
    stop_at_time_limit,
    time_limit_reason,
)
from django_delayqueue.core.consumer.limits.watchdog import STOP_WAIT_SECONDS, Watchdog
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import ACK, RETRY, run_handler
from django_delayqueue.core.errors import SoftTimeLimitExceeded, TimeLimitExceeded


class Mono:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def message(mid: str = "m1", queue: str = "q") -> Message:
    return Message(mid, queue, None, 0, 0, 1, "7")


class HandlerThread:
    """Runs ``body`` as a handler would (a Run registered in ``runs``), on a thread."""

    def __init__(self, runs: Runs, body: Callable[[Message], Any], started: float) -> None:
        self.runs, self.body, self.started_at = runs, body, started
        self.outcome: Any = None
        self.run: Run | None = None
        self.entered = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        assert self.entered.wait(TIMEOUT)

    def _main(self) -> None:
        m = message()
        run = self.run = Run(m, "q", started_monotonic=self.started_at)
        token = self.runs.start(run)
        self.entered.set()
        try:
            outcome = run_handler(self.body, m, 0)
        finally:
            self.runs.end(run, token)
        self.outcome = run.settled(outcome)

    def join(self) -> Any:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()
        return self.outcome


@pytest.fixture
def mono() -> Mono:
    return Mono()


def watchdog(
    runs: Runs, mono: Mono, found: list[Run], **limits: Any
) -> tuple[Watchdog, QueueSettings]:
    settings = QueueSettings(**limits)
    return Watchdog(runs, lambda name: settings, found.append, mono), settings


def test_soft_limit_raises_once_and_a_handler_that_returns_after_it_acks(mono: Mono) -> None:
    runs, found = Runs(), []
    dog, _ = watchdog(runs, mono, found, soft_time_limit=5, time_limit=10)
    warned, go_on = threading.Event(), threading.Event()
    seen: list[str] = []

    def body(m: Message) -> str:
        while True:  # pure Python: the exception lands within a switch interval
            try:
                while not go_on.is_set():
                    pass
                return "cleaned up"
            except SoftTimeLimitExceeded as e:
                seen.append(str(e))
                warned.set()

    h = HandlerThread(runs, body, started=mono.now)
    assert dog.check() == mono.now + 5  # nothing yet: next look at the soft limit
    mono.now += 5
    dog.check()
    assert warned.wait(TIMEOUT)
    dog.check()  # once only
    go_on.set()
    outcome = h.join()
    assert outcome.status == ACK
    assert seen == ["soft time limit exceeded (5 s)"]
    assert found == []


def test_hard_limit_stops_a_pure_python_handler_that_swallows_exceptions(mono: Mono) -> None:
    runs, found = Runs(), []
    dog, _ = watchdog(runs, mono, found, soft_time_limit=1, time_limit=2)
    caught: list[BaseException] = []
    warned = threading.Event()

    def body(m: Message) -> None:
        while True:
            try:
                while True:
                    pass
            except Exception as e:  # the soft limit; never the hard one (a BaseException)
                caught.append(e)
                warned.set()

    h = HandlerThread(runs, body, started=mono.now)
    mono.now += 1
    dog.check()
    assert warned.wait(TIMEOUT)
    mono.now += 1
    assert dog.check() == mono.now + STOP_WAIT_SECONDS
    outcome = h.join()
    assert [type(e) for e in caught] == [SoftTimeLimitExceeded]
    assert (outcome.status, outcome.reason) == (RETRY, time_limit_reason(2))
    assert outcome.error == "TimeLimitExceeded"
    mono.now += STOP_WAIT_SECONDS
    dog.check()
    assert found == []  # it ended: not unstoppable


def test_a_handler_that_returns_after_its_stop_is_retried_anyway(mono: Mono) -> None:
    runs, found = Runs(), []
    dog, _ = watchdog(runs, mono, found, time_limit=1)

    def body(m: Message) -> str:
        try:
            while True:
                pass
        except TimeLimitExceeded:
            return "pretended success"

    h = HandlerThread(runs, body, started=mono.now)
    mono.now += 1
    dog.check()
    outcome = h.join()
    assert (outcome.status, outcome.reason) == (RETRY, time_limit_reason(1))


@pytest.fixture
def blocked_socket() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_handler_blocked_in_a_socket_read_is_unstoppable(
    mono: Mono, blocked_socket: tuple[socket.socket, socket.socket]
) -> None:
    reader, writer = blocked_socket
    runs, found = Runs(), []
    dog, _ = watchdog(runs, mono, found, time_limit=3)
    late: list[BaseException] = []

    def body(m: Message) -> bytes:
        try:
            return reader.recv(1)  # no timeout: the exception waits for the read to return
        except BaseException as e:
            late.append(e)
            raise

    h = HandlerThread(runs, body, started=mono.now)
    mono.now += 3
    dog.check()
    run = h.run
    assert run is not None and run.stop is not None
    mono.now += STOP_WAIT_SECONDS / 2
    dog.check()
    assert found == []  # its wait is not over
    mono.now += STOP_WAIT_SECONDS
    dog.check()
    assert found == [run] and run.unstoppable
    assert run.stopped_handler() == StoppedHandler(
        "q", "m1", "7", 1, "retry", "time limit exceeded (3 s)"
    )
    dog.check()
    assert found == [run]  # reported once
    writer.send(b"x")  # the read returns: the exception sent long ago lands now
    outcome = h.join()
    assert [type(e) for e in late] == [TimeLimitExceeded]
    assert outcome.status == RETRY


# --- inside a running consumer ----------------------------------------------------------------


class Supervised(Consumer):
    """A consumer whose replacement_needed records what a supervisor would be given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replacements: list[list[StoppedHandler]] = []
        self.asked = threading.Event()

    def replacement_needed(self, stopped: list[StoppedHandler]) -> None:
        self.replacements.append(stopped)
        self.asked.set()


def test_consumer_retries_a_handler_stopped_at_its_time_limit(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue("limited", clock=SystemClock(), time_limit=0.3, backoff_base=60, backoff_max=60)
    q.schedule("spin", id="m1")
    starts: list[int] = []

    def spin(m: Message) -> None:
        starts.append(m.attempt)
        while True:
            try:
                while True:
                    pass
            except Exception:  # does not catch TimeLimitExceeded
                continue

    consumer = Supervised([q], spin, idle_seconds=0.1)
    r = running(consumer)
    wait_until(lambda: q.counts()["retry"] == 1)
    assert redis_client.hget(q.keys.reasons, "m1") == b"time limit exceeded (0.3 s)"
    assert redis_client.hget(q.keys.attempts, "m1") == b"1"
    assert consumer.replacements == [] and not consumer.stopping
    r.stop()
    assert starts == [1]


def test_consumer_blocked_handler_asks_for_a_replacement_and_stops(
    redis_client: redis.Redis,
    make_queue: Any,
    running: Any,
    blocked_socket: tuple[socket.socket, socket.socket],
) -> None:
    reader, writer = blocked_socket
    clock = SystemClock()
    stuck_q = make_queue("stuck", clock=clock, time_limit=0.3)
    other_q = make_queue("other", clock=clock)
    stuck_q.schedule("gateway call", id="s1")
    other_started, other_go = threading.Event(), threading.Event()

    def handler(m: Message) -> None:
        if m.queue == "stuck":
            reader.recv(1)  # blocked in C, no timeout: the stop cannot land
            return
        other_started.set()
        assert other_go.wait(TIMEOUT)

    consumer = Supervised([stuck_q, other_q], handler, idle_seconds=0.1, grace_seconds=60)
    r = running(consumer)
    wait_until(lambda: redis_client.zcard(stuck_q.keys.unack) == 1)
    other_q.schedule("quick", id="o1")
    assert other_started.wait(TIMEOUT)
    assert consumer.asked.wait(TIMEOUT)
    (token,) = [t.decode() for t in redis_client.hmget(stuck_q.keys.tokens, ["s1"])]
    assert consumer.replacements == [
        [StoppedHandler("stuck", "s1", token, 1, "retry", "time limit exceeded (0.3 s)")]
    ]
    # Then it stops as on SIGTERM (the loop's thread, just after the hook): the other
    # handler may finish.
    wait_until(lambda: consumer.stopping)
    other_go.set()
    assert r.join() == 1
    assert other_q.counts()["unack"] == 0 and redis_client.hlen(other_q.keys.messages) == 0
    # Nothing recorded for the stuck one: in flight, its reason unset, still extended.
    assert stuck_q.counts()["unack"] == 1
    assert redis_client.hget(stuck_q.keys.reasons, "s1") is None
    assert consumer.replaced_for == consumer.replacements[0]
    writer.send(b"x")  # let the thread end (its late TimeLimitExceeded lands and is dropped)
    wait_until(lambda: not consumer.running_handlers())
    assert stuck_q.counts()["unack"] == 1  # its outcome was dropped


# --- one watchdog for threads and coroutines ----------------------------------------------------


class Told:
    """A coroutine's stopper, as its runner's (handlers/coroutines.py: CoroutineStop) is told:
    what the watchdog said, recorded."""

    stop_wait_seconds = 1.0  # a coroutine's own (a thread's is STOP_WAIT_SECONDS)

    def __init__(self) -> None:
        self.told: list[tuple[str, ...]] = []

    def soft_limit(self, reason: str) -> None:
        self.told.append(("soft", reason))

    def stop(self, exception: type[BaseException], settlement: str, reason: str) -> None:
        self.told.append((exception.__name__, settlement, reason))


def test_the_watchdog_keeps_a_coroutines_soft_and_hard_limits_and_reports_it_unstoppable(
    mono: Mono,
) -> None:
    """Before: the watchdog left a coroutine's limits to a second timing thread of the
    coroutines runner (its check() found nothing due for it); now the one watchdog decides them
    in the same code as a thread's, telling the coroutine through its Run's stopper, and times
    its stop with the Run's own stop wait."""
    runs, found = Runs(), []
    dog, _ = watchdog(runs, mono, found, soft_time_limit=1, time_limit=2)
    told = Told()
    run = Run(message(), "q", told, started_monotonic=mono.now)  # type: ignore[arg-type]
    runs.register(run)
    assert dog.check() == mono.now + 1  # its soft limit is due
    mono.now += 1
    assert dog.check() == mono.now + 1  # then its hard one
    assert told.told == [("soft", "soft time limit exceeded (1 s)")]
    dog.check()  # once only
    mono.now += 1
    assert dog.check() == mono.now + Told.stop_wait_seconds
    assert told.told[1:] == [("TimeLimitExceeded", "retry", time_limit_reason(2))]
    mono.now += STOP_WAIT_SECONDS  # a thread's wait is over, not a coroutine's
    dog.check()
    assert found == []
    mono.now += Told.stop_wait_seconds - STOP_WAIT_SECONDS
    dog.check()
    assert found == [run]  # still running: unstoppable, reported once
    assert run.stopped_handler() == StoppedHandler.of(message(), "retry", time_limit_reason(2))
    dog.check()
    assert found == [run]
    runs.end(run)
    assert dog.check() == float("inf")


def test_a_coroutine_at_its_time_limit_is_stopped_and_logged_as_a_thread_is(
    mono: Mono, caplog: pytest.LogCaptureFixture
) -> None:
    """The one decision (stop_at_time_limit) for a thread and a coroutine: retried with the
    time limit's reason, logged as a thread's; once aborted, as the abort (the abort wins over
    a limit that comes in its grace)."""
    runs, found = Runs(), []
    dog, _ = watchdog(runs, mono, found, soft_time_limit=1, time_limit=2, abort_grace_seconds=600)
    told = {mid: Told() for mid in ("m1", "m2")}
    for mid in ("m1", "m2"):
        m = Message(mid, "q", None, 0, 0, 1, mid)
        runs.register(Run(m, "q", told[mid], started_monotonic=mono.now))  # type: ignore[arg-type]
    aborted = runs.get("q", "m2")
    assert aborted is not None and aborted.learn_abort("by staff", mono.now)
    mono.now += 2
    with caplog.at_level(logging.WARNING, logger="django_delayqueue"):
        dog.check()
    # Both limits due at once: the hard one only (as for a thread).
    assert told["m1"].told == [("TimeLimitExceeded", "retry", time_limit_reason(2.0))]
    assert told["m2"].told == [("Aborted", "dead", "aborted: by staff")]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"queue q: message m1 (attempt 1): {time_limit_reason(2.0)}, stopping its handler",
        "queue q: message m2 aborted (by staff) and at its time limit (2 s): stopping it",
    ]
    assert all(getattr(r, "dq_message_id", None) in ("m1", "m2") for r in caplog.records)
    assert stop_at_time_limit(message("m1"), 2.0, None) == ("retry", time_limit_reason(2.0))


class StuckLoop:
    """An event loop that runs the callbacks it is given only when the test says."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], Any]] = []

    def call_soon_threadsafe(self, callback: Callable[[], Any]) -> None:
        self.pending.append(callback)

    def run_once(self) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback()


def test_the_watchdogs_look_warns_once_of_a_loop_that_gives_no_sign_of_life(
    mono: Mono, caplog: pytest.LogCaptureFixture
) -> None:
    loop = StuckLoop()
    entries: list[Any] = []
    liveness = LoopLiveness(lambda: (loop, entries))  # type: ignore[arg-type,return-value]
    dog = Watchdog(Runs(), lambda name: None, lambda run: None, mono, also=liveness.look)
    assert dog.check() == float("inf")  # nothing runs on it: not pinged
    assert loop.pending == []
    entries.append(RunningCoroutine(message("m1"), lambda outcome: None))
    with caplog.at_level(logging.WARNING, logger="django_delayqueue"):
        assert dog.check() == mono.now + PING_SECONDS  # pinged: looks again soon
        loop.run_once()  # it answers
        mono.now += BLOCKED_WARN_SECONDS
        dog.check()
        assert caplog.records == []
        mono.now += BLOCKED_WARN_SECONDS  # blocked since the last ping
        dog.check()
        mono.now += PING_SECONDS
        dog.check()  # said once
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "has not run for 2.0s" in lines[0] and "q/m1" in lines[0]
    assert len(loop.pending) == 1  # one ping at a time


def test_a_delivery_awaited_on_a_loop_of_the_callers_own_is_cancelled_at_its_limit(
    mono: Mono,
) -> None:
    """``Consumer.adeliver`` awaited on a loop that is not the coroutines runner's: its Run's
    stopper had no coroutine of the runner to tell, so the stop at its time limit did nothing
    and, a second later, the run was reported unstoppable (the consumer then stops). Its stop
    now cancels the task awaiting it, on that task's loop, and nothing is reported."""
    runs, found = Runs(monotonic=mono), []
    dog, _ = watchdog(runs, mono, found, time_limit=5)
    coroutines = HandlerCoroutines(None, runs)  # type: ignore[arg-type]
    begun, ended = threading.Event(), threading.Event()
    seen: list[BaseException] = []

    async def deliver() -> None:  # the steps HandlerDelivery.adeliver takes around a handler
        m = message()
        stopper = coroutines.stopper(m)
        run, context = runs.begin(m, "q", stopper)
        assert not stopper.attach(run)  # not the runner's: ends with its handler
        begun.set()
        try:
            await asyncio.Event().wait()  # a handler that waits for ever
        except BaseException as e:
            seen.append(e)
            raise
        finally:
            runs.end(run, context)
            ended.set()

    thread = threading.Thread(target=_run, args=(deliver,), daemon=True)
    thread.start()
    assert begun.wait(TIMEOUT)
    mono.now += 5
    dog.check()  # its time limit: stopped
    assert ended.wait(TIMEOUT)
    thread.join(TIMEOUT)
    assert [type(e).__name__ for e in seen] == ["CancelledError"]
    mono.now += 2  # past any stop wait
    dog.check()
    assert found == []


def _run(deliver: Callable[[], Any]) -> None:
    with contextlib.suppress(asyncio.CancelledError):  # the stop, seen by the test already
        asyncio.run(deliver())
