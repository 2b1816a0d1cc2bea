"""``async def`` handlers: every consumer's coroutines on one event loop, on a thread of its own.

A thread per running handler is what makes a sync handler's concurrency cost memory and context
switches; a coroutine costs neither, so a queue whose handlers are coroutines may run hundreds at
once on one loop. The loop thread (:class:`HandlerCoroutines`) starts when the first coroutine
does. Which messages run here, and how many at once, is the handler threads' business
(:mod:`.handler_threads`): they count a running coroutine against their queue's concurrency as
they count a running thread, and hand it the message; this module runs it and gives the outcome
back through the same ``done`` callback a handler thread's outcome takes.

Stopping a coroutine is cancelling it (:meth:`HandlerCoroutines.cancel`): a time limit, an abort,
the end of a stop's grace period. Its outcome is then what the canceller said (retried with the
time limit's reason, or dead for an abort), whatever the coroutine did after. At the soft limit
the coroutine gets ``SoftTimeLimitExceeded`` at the ``await`` it waits in (:class:`_Interruptible`).

Two things a coroutine can do that cancelling cannot stop: catch ``CancelledError`` and go on, or
block the loop in sync code (then nothing on the loop runs, cancellation included). The watcher
thread sees both: a coroutine still running :data:`STOP_WAIT_SECONDS` after it was cancelled is
unstoppable, and is reported (``on_unstoppable``) so that the consumer gets its process replaced,
as for a thread that cannot be stopped (``Consumer.replacement_needed``); a loop that has not
answered for :data:`BLOCKED_WARN_SECONDS` is logged, naming the coroutines it holds up.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from django_delayqueue.core.consumer.outcomes import Outcome, failed_outcome
from django_delayqueue.core.consumer.stopped import (
    Settlement,
    StoppedHandler,
    time_limit_reason,
)
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import SoftTimeLimitExceeded
from django_delayqueue.core.journal import GARBAGE, RETRY

logger = logging.getLogger(__name__)

# How long a cancelled coroutine gets to end before it counts as unstoppable.
STOP_WAIT_SECONDS = 1.0
# How often the watcher asks the loop for a sign of life while coroutines run, and after how
# long without one it says the loop is blocked.
PING_SECONDS = 0.25
BLOCKED_WARN_SECONDS = 2.0
CLOSE_JOIN_SECONDS = 1.0


class CoroutineDeliverer(Protocol):
    """What the event loop runs (the consumer)."""

    def runs_async(self, message: Message) -> bool:
        """Whether ``message``'s handler is a coroutine function."""
        ...

    def adeliver(self, message: Message) -> Awaitable[Outcome]:
        """Run ``message``'s coroutine handler on the event loop (never raises)."""
        ...

    def time_limits(self, message: Message) -> tuple[float | None, float | None]:
        """``message``'s queue's (soft_time_limit, time_limit) in seconds, None: no limit."""
        ...


@dataclass
class _Running:
    message: Message
    done: Callable[[Outcome], None]
    started: float  # time.monotonic()
    soft_limit: float | None
    hard_limit: float | None
    task: asyncio.Task[None] | None = None
    body: _Interruptible | None = None
    inner: list[_Interruptible] = field(default_factory=list)  # see interruptible()
    soft_sent: bool = False
    stop: tuple[Settlement, str] | None = None  # how the canceller settles it
    stop_sent_at: float | None = None
    reported: bool = False  # as unstoppable
    # Its sync code running on a thread (sync_part): a thread outlives a closed loop.
    sync_parts: int = 0
    # Dropped with the loop while sync_parts ran: given to ``done`` once they have ended.
    held: Outcome | None = None


class _Interruptible:
    """Awaits ``coro`` as ``await coro`` would, and can raise an exception of our choosing at the
    ``await`` it is suspended in (:meth:`interrupt`).

    Asyncio offers one way to wake a suspended coroutine: cancel its task (which cancels the
    future it waits for). This stands between the task and the coroutine, and turns that one
    CancelledError into ``error``; every other exception and every value passes through, and the
    task's cancel count is put back (``uncancel``), so ``asyncio.timeout`` and TaskGroups inside
    the handler are not confused.
    """

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro: Any = coro.__await__()
        self._error: BaseException | None = None
        self._task: asyncio.Task[Any] | None = None  # the task awaiting it
        self.awaiting = False  # between the first step and the end

    def interrupt(self, error: BaseException) -> bool:
        """On the loop's thread: raise ``error`` in the coroutine at its current await."""
        if not self.awaiting or self._error is not None or self._task is None:
            return False
        self._error = error
        self._task.cancel()
        return True

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        self._task = asyncio.current_task()
        self.awaiting = True
        try:
            while True:
                try:
                    yielded = coro.send(value) if error is None else coro.throw(error)
                except StopIteration as stop:
                    return stop.value
                try:
                    value, error = (yield yielded), None
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as e:
                    value, error = None, e
                    if isinstance(e, asyncio.CancelledError) and self._error is not None:
                        error, self._error = self._error, None
                        task = asyncio.current_task()
                        if task is not None and hasattr(task, "uncancel"):  # Python 3.11+
                            task.uncancel()
        finally:
            self.awaiting = False


# The interruptibles of the message whose context this is (a list shared with the tasks it
# starts, which copy the context): where the soft time limit is raised.
_soft_targets: contextvars.ContextVar[list[_Interruptible] | None] = contextvars.ContextVar(
    "delayqueue_soft_targets", default=None
)


_current: contextvars.ContextVar[_Running | None] = contextvars.ContextVar(
    "delayqueue_current_coroutine", default=None
)


def requested_stop() -> tuple[Settlement, str] | None:
    """Inside a coroutine handler: how :meth:`HandlerCoroutines.cancel` asked it to stop
    ("retry" or "dead", and the reason), or None (not stopped, or not a coroutine handler).
    What it records (a task's result) follows it: an aborted task reads FAILED."""
    entry = _current.get()
    return None if entry is None else entry.stop


def interruptible(coro: Awaitable[Any]) -> Awaitable[Any]:
    """Await ``coro`` through this so that the soft time limit of the message being handled is
    raised inside it (``SoftTimeLimitExceeded`` at its await), though it runs in a task of its
    own: ``asyncio.gather`` of several receivers puts each in a task, and cancelling the gather
    would only cancel them. Outside a coroutine handler, ``coro`` as it is."""
    targets = _soft_targets.get()
    if targets is None:
        return coro
    body = _Interruptible(coro)
    targets.append(body)
    return body


# Guards _Running.sync_parts and .held: changed on the loop's thread, on the threads running the
# sync parts, and on the loop's thread as it ends (_release_dropped).
_sync_lock = threading.Lock()


def sync_part(func: Callable[..., Any]) -> Callable[..., Any]:
    """Inside a coroutine handler: ``func``, to be run on a thread, wrapped so that the
    message stays held while it runs. A coroutine dropped with a closing loop
    (:meth:`HandlerCoroutines.close`) is released only once its sync parts have ended: until
    then its message stays given up on and extended (``Extender.linger``), never redelivered
    beside code of its own that still runs. Call it on the loop, where the thread is started
    (``dispatch.in_thread_to_its_end``). Outside a coroutine handler, ``func`` as it is."""
    entry = _current.get()
    if entry is None:
        return func
    with _sync_lock:
        entry.sync_parts += 1

    def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        finally:
            _sync_part_ended(entry)

    return tracked


def _sync_part_ended(entry: _Running) -> None:
    with _sync_lock:
        entry.sync_parts -= 1
        outcome = entry.held if entry.sync_parts == 0 else None
        entry.held = None if outcome is not None else entry.held
    if outcome is not None:
        logger.warning(
            "message %s: the sync part of its coroutine handler ended after the event loop: "
            "released, it comes back after its visibility timeout",
            entry.message.id,
        )
        _release(entry, outcome)


def _release(entry: _Running, outcome: Outcome) -> None:
    try:
        entry.done(outcome)
    except Exception:
        logger.exception("coroutine of message %s: not released", entry.message.id)


class HandlerCoroutines:
    """One event loop, on a thread of its own, running the coroutine handlers of a consumer."""

    def __init__(
        self,
        deliverer: CoroutineDeliverer,
        on_unstoppable: Callable[[list[StoppedHandler]], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deliverer = deliverer
        self._on_unstoppable = on_unstoppable
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified as a coroutine ends
        self._running: dict[tuple[str, str], _Running] = {}  # by (queue, token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._wake = threading.Event()  # the watcher looks again now
        self._closed = False
        self._last_pong = 0.0
        self._ping_pending = False
        self._said_blocked = False

    # --- any thread ------------------------------------------------------------------------------

    def runs_async(self, message: Message) -> bool:
        """Whether ``message`` runs here; a deliverer that fails to tell sends it to a thread,
        where its handler fails as it would have."""
        try:
            return bool(self._deliverer.runs_async(message))
        except Exception:
            logger.exception("message %s: cannot tell whether its handler is async", message.id)
            return False

    @property
    def thread_ident(self) -> int:
        """The event loop thread's ``threading.get_ident()`` (0 before it started)."""
        thread = self._thread
        return thread.ident or 0 if thread is not None else 0

    def start(self, message: Message, done: Callable[[Outcome], None]) -> int:
        """Run ``message``'s coroutine handler; ``done(outcome)`` is called on the loop thread
        when it ends, once. Returns the loop thread's ident."""
        soft, hard = self._deliverer.time_limits(message)
        entry = _Running(message, done, self._monotonic(), soft, hard)
        with self._lock:
            if self._closed:  # a stop ended the loop: the caller records a failed attempt
                raise RuntimeError("the event loop of the coroutine handlers is closed")
            loop = self._started_loop()
            self._running[(message.queue, message.token)] = entry
        loop.call_soon_threadsafe(self._begin, entry)
        if soft is not None or hard is not None:
            self._wake.set()
        return self.thread_ident

    def cancel(self, queue: str, token: str, reason: str, settlement: Settlement = "retry") -> bool:
        """Stop the coroutine running delivery ``token`` of ``queue``: its message is then
        retried (``settlement="retry"``: a time limit) or sent to the dead letters (``"dead"``:
        an abort), with ``reason``. False when no such coroutine runs (or it was stopped
        already). A coroutine that does not end within :data:`STOP_WAIT_SECONDS` is reported as
        unstoppable."""
        with self._lock:
            entry = self._running.get((queue, token))
            if entry is None or entry.stop is not None or self._loop is None:
                return False
            entry.stop = (settlement, reason)
            entry.stop_sent_at = self._monotonic()
            loop = self._loop
        loop.call_soon_threadsafe(self._cancel_task, entry, reason)
        self._wake.set()
        return True

    def cancel_all(self, reason: str) -> int:
        """Cancel every running coroutine, their messages left as they are (the end of a stop:
        they stay in flight, as a stop leaves a thread's). Returns how many."""
        with self._lock:
            entries = list(self._running.values())
            loop = self._loop
        if loop is None:
            return 0
        for entry in entries:
            loop.call_soon_threadsafe(self._cancel_task, entry, reason)
        return len(entries)

    def tokens(self) -> list[tuple[str, str]]:
        """(queue, token) of every running coroutine."""
        with self._lock:
            return list(self._running)

    def close(self) -> None:
        """Stop the loop and the watcher, once the coroutines still running ended (cancelled by
        ``cancel_all``), :data:`STOP_WAIT_SECONDS` at most: one that did not is dropped with
        the loop (its message stays as the stop left it, in flight)."""
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        with self._lock:
            while self._running and self._loop is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ended.wait(left)
            self._closed = True
            loop, thread, watcher = self._loop, self._thread, self._watcher
        self._wake.set()
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join(CLOSE_JOIN_SECONDS)
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(CLOSE_JOIN_SECONDS)

    # --- the event loop's thread ----------------------------------------------------------------

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        """The loop, its thread and the watcher started on the first coroutine (under _lock)."""
        if self._loop is not None:
            return self._loop
        loop = self._loop = asyncio.new_event_loop()
        self._last_pong = self._monotonic()
        self._thread = threading.Thread(
            target=self._serve, args=(loop,), name="delayqueue-event-loop", daemon=True
        )
        self._thread.start()
        self._watcher = threading.Thread(
            target=self._watch, name="delayqueue-event-loop-watcher", daemon=True
        )
        self._watcher.start()
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
                loop.close()
            except Exception:  # tasks still pending are dropped with it
                logger.debug("event loop closed with tasks pending", exc_info=True)
            self._release_dropped()

    def _release_dropped(self) -> None:
        """The loop is gone: the coroutines it still held can never run again. Their messages
        (given up on at the stop that closed the loop) are released, no longer extended: they
        come back after their visibility timeout, as a stopped handler's. One whose sync part
        still runs on its thread (:func:`sync_part`) is released only once that has ended:
        in a process that lives on (``--burst``, ``run()`` as a library) it would otherwise
        run beside its message's redelivery."""
        with self._lock:
            dropped = list(self._running.values())
            self._running.clear()
            self._ended.notify_all()
        now_ms = int(time.time() * 1000)
        for entry in dropped:
            outcome = Outcome(
                entry.message, RETRY, now_ms, now_ms, None, "the event loop ended while it ran"
            )
            with _sync_lock:
                held = entry.sync_parts > 0
                if held:
                    entry.held = outcome
            if held:
                logger.warning(
                    "message %s: its coroutine handler's sync part still runs on its thread: "
                    "kept in flight until it ends",
                    entry.message.id,
                )
                continue
            _release(entry, outcome)

    def _begin(self, entry: _Running) -> None:
        loop = asyncio.get_running_loop()
        started_ms, t0 = int(time.time() * 1000), time.perf_counter()
        entry.task = loop.create_task(self._drive(entry, started_ms, t0))
        # A task cancelled before its first step never runs a line of _drive: it ends here.
        entry.task.add_done_callback(lambda task: self._ended_early(entry, task, started_ms, t0))

    async def _drive(self, entry: _Running, started_ms: int, t0: float) -> None:
        message = entry.message
        _soft_targets.set(entry.inner)  # this task's own context: this message only
        _current.set(entry)
        body = entry.body = _Interruptible(self._deliverer.adeliver(message))
        try:
            outcome = await body
        except GeneratorExit:  # closed with its loop: _release_dropped answers for it
            raise
        except BaseException as e:  # cancelled before its handler started, or adeliver broke
            outcome = failed_outcome(message, e, started_ms, t0)
        self._end(entry, outcome)

    def _ended_early(self, entry: _Running, task: asyncio.Task[None], ms: int, t0: float) -> None:
        """The task ended without _drive's own end (cancelled before its first step)."""
        with self._lock:
            if (entry.message.queue, entry.message.token) not in self._running:
                return  # _drive ended it
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        self._end(entry, failed_outcome(entry.message, error or RuntimeError(), ms, t0))

    def _end(self, entry: _Running, outcome: Outcome) -> None:
        """Its outcome (as its canceller settled it, if it was cancelled) to ``done``, once."""
        message = entry.message
        if entry.stop is not None:
            settlement, reason = entry.stop
            status = GARBAGE if settlement == "dead" else RETRY
            outcome = replace(outcome, status=status, reason=reason, delay=None)
        with self._lock:
            if self._running.pop((message.queue, message.token), None) is None:
                return  # ended already (released with the loop)
            self._ended.notify_all()
        try:
            entry.done(outcome)
        except Exception:
            logger.exception("coroutine handler of message %s: outcome not taken", message.id)

    @staticmethod
    def _cancel_task(entry: _Running, reason: str) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.cancel(reason)

    def _soft_limit(self, entry: _Running) -> None:
        """Raise SoftTimeLimitExceeded where the handler waits: in each of its receivers that
        waits in a task of its own (``interruptible``), else in the handler's own task."""
        if entry.task is None or entry.body is None or entry.task.done():
            return
        message = f"soft time limit exceeded ({entry.soft_limit:g} s)"
        inner = [body for body in entry.inner if body.awaiting]
        for body in inner or [entry.body]:
            body.interrupt(SoftTimeLimitExceeded(message))

    def _pong(self) -> None:
        self._last_pong = self._monotonic()
        self._ping_pending = False

    # --- the watcher's thread -------------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            self._wake.wait(self._check())
            self._wake.clear()
            if self._closed:
                return

    def _check(self) -> float:
        """Send the limits that are due, report the unstoppable; seconds until the next look."""
        now = self._monotonic()
        with self._lock:
            entries = list(self._running.values())
            loop = self._loop
        if loop is None or not entries:
            self._said_blocked = False
            self._last_pong = now  # silence while nothing runs is no sign of a blocked loop
            return 60.0
        next_in = PING_SECONDS
        unstoppable: list[StoppedHandler] = []
        for entry in entries:
            elapsed = now - entry.started
            if entry.soft_limit is not None and not entry.soft_sent:
                if elapsed >= entry.soft_limit:
                    entry.soft_sent = True
                    loop.call_soon_threadsafe(self._soft_limit, entry)
                else:
                    next_in = min(next_in, entry.soft_limit - elapsed)
            if entry.hard_limit is not None and entry.stop is None:
                if elapsed >= entry.hard_limit:
                    reason = time_limit_reason(entry.hard_limit)
                    self.cancel(entry.message.queue, entry.message.token, reason)
                else:
                    next_in = min(next_in, entry.hard_limit - elapsed)
            if entry.stop_sent_at is not None and not entry.reported:
                waited = now - entry.stop_sent_at
                if waited >= STOP_WAIT_SECONDS:
                    entry.reported = True
                    settlement, reason = entry.stop or ("retry", "")
                    unstoppable.append(StoppedHandler.of(entry.message, settlement, reason))
                else:
                    next_in = min(next_in, STOP_WAIT_SECONDS - waited)
        self._watch_the_loop(loop, now, entries)
        if unstoppable:
            logger.error(
                "%d coroutine handler(s) did not end when cancelled (they catch CancelledError "
                "or block the event loop): this process must be replaced for them to stop: %s",
                len(unstoppable),
                ", ".join(f"{s.queue}/{s.message_id}" for s in unstoppable),
            )
            try:
                self._on_unstoppable(unstoppable)
            except Exception:
                logger.exception("reporting unstoppable coroutine handlers failed")
        return max(0.01, next_in)

    def _watch_the_loop(
        self, loop: asyncio.AbstractEventLoop, now: float, entries: list[_Running]
    ) -> None:
        """Ask the loop for a sign of life; say so (once) when it has given none for long."""
        silent = now - self._last_pong
        if silent >= BLOCKED_WARN_SECONDS and not self._said_blocked:
            self._said_blocked = True
            logger.warning(
                "the event loop of the coroutine handlers has not run for %.1fs: a coroutine "
                "blocks it in sync code (use await, or sync_to_async); %d coroutine(s) wait: %s",
                silent,
                len(entries),
                ", ".join(f"{e.message.queue}/{e.message.id}" for e in entries[:10]),
            )
        elif silent < BLOCKED_WARN_SECONDS:
            self._said_blocked = False
        if not self._ping_pending:
            self._ping_pending = True
            loop.call_soon_threadsafe(self._pong)
