"""``async def`` handlers: every consumer's coroutines on one event loop, on a thread of its own.

A thread per running handler is what makes a sync handler's concurrency cost memory and context
switches; a coroutine costs neither, so a queue whose handlers are coroutines may run hundreds at
once on one loop. The loop thread (:class:`HandlerCoroutines`) starts when the first coroutine
does. Which messages run here, and how many at once, is the handler threads' business
(:mod:`.handlers.threads`): they count a running coroutine against their queue's concurrency as
they count a running thread, and hand it the message; this module runs it and gives the outcome
back through the same ``done`` callback a handler thread's outcome takes.

Its time limits and its abort's grace are kept by the consumer's one watchdog
(:mod:`.limits.watchdog`), as a thread's are: the delivery's Run carries this runner's
:class:`CoroutineStop`, through which the watchdog raises its soft limit on the loop
(:func:`raise_soft_limit`) and stops it. Stopping a coroutine is cancelling it
(:meth:`HandlerCoroutines.cancel`): a time limit, an abort, the end of a stop's grace period.
Its outcome is then what the canceller said (retried with the time limit's reason, or dead for
an abort), whatever the coroutine did after; but an abort
learnt before it ended wins over a time limit (:meth:`HandlerCoroutines.settlement`), as it does
for a thread: dead letters with the abort's reason, never a retry. A delivery ends only once the
work it handed to threads has ended too (:mod:`.handlers.coroutine_threads`): cancelling stops the
waiting, not a thread, so until then it stays running (its outcome held, its message in flight
and extended, its Run watched: this runner ends it with the delivery), and a thread still
running a moment after a stop (:data:`STOP_WAIT_SECONDS`) makes it unstoppable.

Beside this runner, each in its own module: what a handler's own task reaches of its run
(:mod:`.handlers.coroutine_context`: its stop request, where its soft limit lands, its sync parts),
the ``await`` that the soft limit interrupts (:mod:`.handlers.interruptible`), and the loop's
sign of life, which the watchdog asks for at each look (:mod:`.handlers.loop_liveness`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from django_delayqueue.core.consumer.handlers.coroutine_context import (
    RunningCoroutine,
    enter,
    hold_for_threads,
)
from django_delayqueue.core.consumer.handlers.coroutine_context import (
    requested_stop as requested_stop,  # re-exported: docs/workers.md names it here
)
from django_delayqueue.core.consumer.handlers.coroutine_threads import install
from django_delayqueue.core.consumer.handlers.interruptible import Interruptible
from django_delayqueue.core.consumer.limits.runs import Run, Runs, Stop
from django_delayqueue.core.consumer.limits.stopped import Settlement, abort_reason
from django_delayqueue.core.consumer.outcomes import (
    Outcome,
    aborted_outcome,
    failed_outcome,
    is_aborted,
)
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import Aborted, SoftTimeLimitExceeded, TimeLimitExceeded
from django_delayqueue.core.journal import RETRY
from django_delayqueue.core.observability.log_fields import message_fields

logger = logging.getLogger(__name__)

CLOSE_JOIN_SECONDS = 1.0
# How long a stopped coroutine's delivery gets to end before it counts as unstoppable (and how
# long close() waits for the cancelled ones): longer than a thread's half second
# (limits/watchdog.py), as a cancel ends it only through the loop: the loop must come round to
# its task (after the steps of every other coroutine on it), and its cleanup awaits (a task's
# record written in a thread after its cancel), where a thread's exception lands within the
# interpreter's switch interval. The watchdog reads it as its Run's (CoroutineStop).
STOP_WAIT_SECONDS = 1.0


class CoroutineDeliverer(Protocol):
    """What the event loop runs (the consumer)."""

    def runs_async(self, message: Message) -> bool:
        """Whether ``message``'s handler is a coroutine function."""
        ...

    def adeliver(self, message: Message) -> Awaitable[Outcome]:
        """Run ``message``'s coroutine handler on the event loop (never raises)."""
        ...


def raise_soft_limit(entry: RunningCoroutine, reason: str) -> None:
    """On the loop's thread: raise SoftTimeLimitExceeded where the handler waits: in each of its
    receivers that waits in a task of its own (``interruptible``), else in the handler's own
    task."""
    if entry.task is None or entry.body is None or entry.task.done():
        return
    inner = [body for body in entry.inner if body.awaiting]
    for body in inner or [entry.body]:
        body.interrupt(SoftTimeLimitExceeded(reason))


class CoroutineStop:
    """How the watchdog tells a coroutine's Run (its :class:`~.limits.runs.Stopper`): its soft
    limit raised on the loop, its stop a cancel; and how long that stop may take. Made by
    :meth:`HandlerCoroutines.stopper` for the delivery it runs (``entry``; None: not one of its
    own, told nothing)."""

    def __init__(self, runner: HandlerCoroutines, entry: RunningCoroutine | None) -> None:
        self._runner = runner
        self.entry = entry

    @property
    def stop_wait_seconds(self) -> float:
        return STOP_WAIT_SECONDS  # read as it is used (a test shortens it)

    def soft_limit(self, reason: str) -> None:
        if self.entry is not None:
            self._runner.raise_soft_limit(self.entry, reason)

    def stop(self, exception: type[BaseException], settlement: Settlement, reason: str) -> None:
        if self.entry is not None:
            self._runner.stop(self.entry, settlement, reason)

    def attach(self, run: Run) -> bool:
        """``run`` is this delivery's: its runner ends it with the delivery (once every thread
        it started has ended), not its handler's end. False: not one of its own."""
        return self.entry is not None and self._runner.attach(self.entry, run)


class TaskStop:
    """The :class:`~.limits.runs.Stopper` of a delivery awaited on a loop that is not this
    runner's (``Consumer.adeliver`` called by the caller's own code): its stop cancels the task
    awaiting it, through that task's loop. Its soft limit is not raised: only the runner knows
    where its handler waits. Its Run ends with its handler (nothing else holds it)."""

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self._task = task
        self._run: Run | None = None

    @property
    def stop_wait_seconds(self) -> float:
        return STOP_WAIT_SECONDS

    def soft_limit(self, reason: str) -> None:
        return None

    def stop(self, exception: type[BaseException], settlement: Settlement, reason: str) -> None:
        task = self._task
        if task is not None and not task.done():
            task.get_loop().call_soon_threadsafe(self._cancel, reason)

    def _cancel(self, reason: str) -> None:
        """On the task's loop: cancel it only if it still runs this delivery's handler (it may
        have returned, and gone on to other work, since the watchdog sent the stop)."""
        task, run = self._task, self._run
        if task is not None and not task.done() and (run is None or run.inside):
            task.cancel(reason)

    def attach(self, run: Run) -> bool:
        self._run = run  # read by _cancel; ended with its handler, not by a runner
        return False


class HandlerCoroutines:
    """One event loop, on a thread of its own, running the coroutine handlers of a consumer."""

    def __init__(self, deliverer: CoroutineDeliverer, runs: Runs | None = None) -> None:
        self._deliverer = deliverer
        # The consumer's runs (which the watchdog keeps): a delivery's Run is ended here, with
        # the delivery. A runner of its own (tests) has runs of its own.
        self._runs = runs if runs is not None else Runs()
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified as a coroutine ends
        self._running: dict[tuple[str, str], RunningCoroutine] = {}  # by (queue, token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._uninstall: Callable[[], None] | None = None  # the loop's executors (install)
        self._closed = False

    # --- any thread ------------------------------------------------------------------------------

    def runs_async(self, message: Message) -> bool:
        """Whether ``message`` runs here; a deliverer that fails to tell sends it to a thread,
        where its handler fails as it would have."""
        try:
            return bool(self._deliverer.runs_async(message))
        except Exception:
            logger.exception(
                "message %s: cannot tell whether its handler is async",
                message.id,
                extra=message_fields(message),
            )
            return False

    @property
    def thread_ident(self) -> int:
        """The event loop thread's ``threading.get_ident()`` (0 before it started)."""
        thread = self._thread
        return thread.ident or 0 if thread is not None else 0

    def start(self, message: Message, done: Callable[[Outcome], None]) -> int:
        """Run ``message``'s coroutine handler; ``done(outcome)`` is called on the loop thread
        when it ends, once. Returns the loop thread's ident."""
        entry = RunningCoroutine(message, done)
        entry.release = lambda outcome: self._release(entry, outcome)
        with self._lock:
            if self._closed:  # a stop ended the loop: the caller records a failed attempt
                raise RuntimeError("the event loop of the coroutine handlers is closed")
            loop = self._started_loop()
            self._running[(message.queue, message.token)] = entry
        loop.call_soon_threadsafe(self._begin, entry)
        return self.thread_ident

    def stopper(self, message: Message) -> CoroutineStop | TaskStop:
        """What the watchdog tells ``message``'s Run through (see :class:`CoroutineStop`); for
        a delivery this runner does not run (``Consumer.adeliver`` awaited on a loop of the
        caller's own), the task awaiting it (:class:`TaskStop`)."""
        with self._lock:
            entry = self._running.get((message.queue, message.token))
        if entry is None:
            return TaskStop(asyncio.current_task())
        return CoroutineStop(self, entry)

    def attach(self, entry: RunningCoroutine, run: Run) -> bool:
        """``run`` is ``entry``'s delivery's, ended here with it; a stop sent before it began
        is its stop too (the watchdog times its end). False once the delivery has ended."""
        with self._lock:
            key = (entry.message.queue, entry.message.token)
            if entry.ended or self._running.get(key) is not entry:
                return False
            entry.run = run
            stop = entry.stop
        if stop is not None and run.stop is None:
            run.stop = Stop(stop[0], stop[1], self._runs.monotonic())
        return True

    def cancel(self, queue: str, token: str, reason: str, settlement: Settlement = "retry") -> bool:
        """Stop the coroutine running delivery ``token`` of ``queue``: its message is then
        retried (``settlement="retry"``: a time limit) or sent to the dead letters (``"dead"``:
        an abort), with ``reason``. False when no such coroutine runs (or it was stopped
        already). The stop is its Run's, once it has one: one that does not end within
        :data:`STOP_WAIT_SECONDS` is reported as unstoppable by the watchdog."""
        with self._lock:
            entry = self._running.get((queue, token))
        if entry is None:
            return False
        run = entry.run
        if run is None:  # not begun yet (waiting until due): stopped before it starts
            return self.stop(entry, settlement, reason)
        exception = Aborted if settlement == "dead" else TimeLimitExceeded
        sent = run.send_stop(settlement, reason, exception, self._runs.monotonic())
        return sent and entry.stop == (settlement, reason)

    def stop(self, entry: RunningCoroutine, settlement: Settlement, reason: str) -> bool:
        """Cancel ``entry``'s task; its outcome is then ``settlement`` with ``reason`` (see
        :meth:`cancel`). False when it has ended (or was stopped already)."""
        with self._lock:
            key = (entry.message.queue, entry.message.token)
            if entry.stop is not None or self._loop is None or self._running.get(key) is not entry:
                return False
            entry.stop = (settlement, reason)
            loop = self._loop
        loop.call_soon_threadsafe(self._cancel_task, entry, reason)
        return True

    def raise_soft_limit(self, entry: RunningCoroutine, reason: str) -> None:
        """Raise ``entry``'s soft limit where it waits, on the loop (:func:`raise_soft_limit`)."""
        loop = self._loop
        if loop is not None:
            # The loop closed meanwhile (RuntimeError): nothing runs there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(raise_soft_limit, entry, reason)

    def cancel_all(self, reason: str) -> int:
        """Cancel every running coroutine, their messages left as they are (the end of a stop:
        they stay in flight, as a stop leaves a thread's, until the threads they started have
        ended). Returns how many."""
        with self._lock:
            entries = list(self._running.values())
            loop = self._loop
        if loop is None:
            return 0
        for entry in entries:
            loop.call_soon_threadsafe(self._cancel_task, entry, reason)
        return len(entries)

    def settlement(self, entry: RunningCoroutine) -> tuple[Settlement, str] | None:
        """How ``entry``'s stop settles its message: as its canceller said, but dead letters
        with the abort's reason once its Run learnt an abort of it (an abort wins over a time
        limit); None when it was not stopped."""
        stop = entry.stop
        if stop is None or stop[0] == "dead":
            return stop
        run = entry.run
        reason = None if run is None else run.abort_reason
        return stop if reason is None else ("dead", abort_reason(reason))

    def tokens(self) -> list[tuple[str, str]]:
        """(queue, token) of every running coroutine."""
        with self._lock:
            return list(self._running)

    def watched(self) -> tuple[asyncio.AbstractEventLoop | None, list[RunningCoroutine]]:
        """The event loop (None before it started) and the coroutines running on it."""
        with self._lock:
            return self._loop, list(self._running.values())

    def close(self) -> None:
        """Stop the loop, once the coroutines still running ended (cancelled by
        ``cancel_all``), :data:`STOP_WAIT_SECONDS` at most: one that did not is dropped with
        the loop (its message stays as the stop left it, in flight), one whose threads still
        run ends with the last of them."""
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        with self._lock:
            while self._running and self._loop is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ended.wait(left)
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join(CLOSE_JOIN_SECONDS)

    # --- the event loop's thread ----------------------------------------------------------------

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        """The loop and its thread, started on the first coroutine (under _lock)."""
        if self._loop is not None:
            return self._loop
        loop = self._loop = asyncio.new_event_loop()
        self._uninstall = install(loop)  # its threads, each counted as its delivery's
        self._thread = threading.Thread(
            target=self._serve, args=(loop,), name="delayqueue-event-loop", daemon=True
        )
        self._thread.start()
        return loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            while not self._closed:
                try:
                    loop.run_forever()
                except BaseException:  # a SystemExit out of a callback: the loop goes on
                    logger.exception("the event loop of the coroutine handlers failed")
        finally:
            try:
                loop.close()  # shuts its default executor down; running threads end on their own
            except Exception:  # tasks still pending are dropped with it
                logger.debug("event loop closed with tasks pending", exc_info=True)
            if self._uninstall is not None:
                self._uninstall()
            self._release_dropped()

    def _release_dropped(self) -> None:
        """The loop is gone: the coroutines it still held can never run again. Their messages
        (given up on at the stop that closed the loop) are released, no longer extended: they
        come back after their visibility timeout, as a stopped handler's. One whose work still
        runs in a thread (``hold_for_threads``) is released only once that has ended: in a
        process that lives on (``--burst``, ``run()`` as a library) it would otherwise run
        beside its message's redelivery."""
        with self._lock:
            dropped = list(self._running.values())
        now_ms = int(time.time() * 1000)
        for entry in dropped:
            outcome = Outcome(
                entry.message, RETRY, now_ms, now_ms, None, "the event loop ended while it ran"
            )
            self._end(entry, outcome)

    def _begin(self, entry: RunningCoroutine) -> None:
        loop = asyncio.get_running_loop()
        started_ms, t0 = int(time.time() * 1000), time.perf_counter()
        entry.task = loop.create_task(self._drive(entry, started_ms, t0))
        # A task cancelled before its first step never runs a line of _drive: it ends here.
        entry.task.add_done_callback(lambda task: self._ended_early(entry, task, started_ms, t0))

    async def _drive(self, entry: RunningCoroutine, started_ms: int, t0: float) -> None:
        message = entry.message
        enter(entry)  # this task's own context: this message only
        body = entry.body = Interruptible(self._deliverer.adeliver(message))
        try:
            outcome = await body
        except GeneratorExit:  # closed with its loop: _release_dropped answers for it
            raise
        except BaseException as e:  # cancelled before its handler started, or adeliver broke
            outcome = failed_outcome(message, e, started_ms, t0)
        self._end(entry, outcome)

    def _ended_early(
        self, entry: RunningCoroutine, task: asyncio.Task[None], ms: int, t0: float
    ) -> None:
        """The task ended without _drive's own end (cancelled before its first step)."""
        with self._lock:
            if entry.ended:
                return  # _drive ended it (its outcome may be held still, or being released)
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        self._end(entry, failed_outcome(entry.message, error or RuntimeError(), ms, t0))

    def _end(self, entry: RunningCoroutine, outcome: Outcome) -> None:
        """The coroutine ended with ``outcome``: its delivery ends now, or once the work it
        started in threads has ended (then it stays running, its Run too: the watchdog keeps its
        limits, and reports it unstoppable when a stop does not end it)."""
        with self._lock:
            if entry.ended or (entry.message.queue, entry.message.token) not in self._running:
                return  # ended already: its first outcome stays
            entry.ended = True
        if hold_for_threads(entry, outcome):
            return
        self._release(entry, outcome)

    def _release(self, entry: RunningCoroutine, outcome: Outcome) -> None:
        """The delivery ended: its outcome (as its canceller settled it, if it was cancelled,
        even after the coroutine itself ended) to ``done``, once. On the loop's thread, or on
        the thread whose work was the delivery's last."""
        message = entry.message
        with self._lock:
            if self._running.pop((message.queue, message.token), None) is None:
                return  # ended already
            self._ended.notify_all()
        # Read once it is off the running list: no stop can come after (cancel finds it gone).
        stop = self.settlement(entry)
        if entry.run is not None:  # the delivery is over: so is its Run (the watchdog's)
            self._runs.end(entry.run)
        # An outcome its run settled as aborted stands (the abort wins over a time limit): its
        # run, which knew of the abort, has ended, so settlement() may no longer know.
        if stop is not None and not is_aborted(outcome):
            settlement, reason = stop
            if settlement == "dead":
                outcome = aborted_outcome(outcome, reason)
            else:
                outcome = replace(outcome, status=RETRY, reason=reason, delay=None)
        try:
            entry.done(outcome)
        except Exception:
            logger.exception(
                "coroutine handler of message %s: outcome not taken",
                message.id,
                extra=message_fields(message),
            )

    @staticmethod
    def _cancel_task(entry: RunningCoroutine, reason: str) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.cancel(reason)
