"""The coroutines' watcher: a thread that keeps their time limits and watches their event loop.

Nothing on the event loop can be trusted to keep time for the coroutines it runs: one that
blocks the loop in sync code stops every timer on it. So a thread of its own looks at them
(:class:`CoroutineWatcher`): it sends the soft limit (:func:`raise_soft_limit`, run on the loop)
and the hard one (a cancel) when due, reports a coroutine still running
:data:`STOP_WAIT_SECONDS` after it was cancelled as unstoppable (``on_unstoppable``: the consumer
gets its process replaced), and logs a loop that has not answered a ping for
:data:`BLOCKED_WARN_SECONDS`. After an abort, as the watchdog does for a thread, the soft limit
is not raised and the time limit stops the coroutine as aborted (the abort wins: one decision and
one log line for both, :func:`.limits.stopped.stop_at_time_limit`). Kept apart from
the runner (:mod:`.handlers.coroutines`), which owns the loop and the running coroutines and
which this only reads and asks to cancel.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from django_delayqueue.core.consumer.handlers.coroutine_context import RunningCoroutine
from django_delayqueue.core.consumer.limits.stopped import (
    Settlement,
    StoppedHandler,
    stop_at_time_limit,
)
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import SoftTimeLimitExceeded

logger = logging.getLogger(__name__)

# How long a cancelled coroutine gets to end before it counts as unstoppable.
STOP_WAIT_SECONDS = 1.0
# How often the watcher asks the loop for a sign of life while coroutines run, and after how
# long without one it says the loop is blocked.
PING_SECONDS = 0.25
BLOCKED_WARN_SECONDS = 2.0


class WatchedCoroutines(Protocol):
    """What the watcher looks at (the consumer's HandlerCoroutines)."""

    def watched(self) -> tuple[asyncio.AbstractEventLoop | None, list[RunningCoroutine]]:
        """The event loop (None before it started) and the coroutines running on it."""
        ...

    def cancel(self, queue: str, token: str, reason: str, settlement: Settlement = "retry") -> bool:
        """Stop the coroutine running delivery ``token`` of ``queue``."""
        ...

    def abort_reason_of(self, message: Message) -> str | None:
        """The reason the running delivery ``message`` was aborted with, once learnt."""
        ...

    def settlement(self, entry: RunningCoroutine) -> tuple[Settlement, str] | None:
        """How ``entry``'s stop settles its message (an abort learnt wins)."""
        ...


def raise_soft_limit(entry: RunningCoroutine) -> None:
    """On the loop's thread: raise SoftTimeLimitExceeded where the handler waits: in each of its
    receivers that waits in a task of its own (``interruptible``), else in the handler's own
    task."""
    if entry.task is None or entry.body is None or entry.task.done():
        return
    message = f"soft time limit exceeded ({entry.soft_limit:g} s)"
    inner = [body for body in entry.inner if body.awaiting]
    for body in inner or [entry.body]:
        body.interrupt(SoftTimeLimitExceeded(message))


class CoroutineWatcher:
    """The watcher's thread, started with the event loop (:meth:`start`)."""

    def __init__(
        self,
        coroutines: WatchedCoroutines,
        on_unstoppable: Callable[[list[StoppedHandler]], None],
        monotonic: Callable[[], float],
    ) -> None:
        self._coroutines = coroutines
        self._on_unstoppable = on_unstoppable
        self._monotonic = monotonic
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # the watcher looks again now
        self._closed = False
        self._last_pong = 0.0
        self._ping_pending = False
        self._said_blocked = False

    def start(self) -> None:
        """Start watching (as the event loop starts)."""
        self._last_pong = self._monotonic()
        self._thread = threading.Thread(
            target=self._watch, name="delayqueue-event-loop-watcher", daemon=True
        )
        self._thread.start()

    def wake(self) -> None:
        """Look again now (a coroutine with limits started, or one was cancelled)."""
        self._wake.set()

    def close(self) -> None:
        """Stop at the next look (now); :meth:`join` waits for it."""
        self._closed = True
        self._wake.set()

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # --- the event loop's thread ----------------------------------------------------------------

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
        loop, entries = self._coroutines.watched()
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
                    if self._coroutines.abort_reason_of(entry.message) is None:
                        loop.call_soon_threadsafe(raise_soft_limit, entry)
                else:
                    next_in = min(next_in, entry.soft_limit - elapsed)
            if entry.hard_limit is not None and entry.stop is None:
                if elapsed >= entry.hard_limit:
                    self._stop_at_time_limit(entry, entry.hard_limit)
                else:
                    next_in = min(next_in, entry.hard_limit - elapsed)
            if entry.stop_sent_at is not None and not entry.reported:
                waited = now - entry.stop_sent_at
                if waited >= STOP_WAIT_SECONDS:
                    entry.reported = True
                    settlement, reason = self._coroutines.settlement(entry) or ("retry", "")
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

    def _stop_at_time_limit(self, entry: RunningCoroutine, seconds: float) -> None:
        """Cancel ``entry`` at its time limit: retried, or, once aborted, as the abort (the
        abort wins over a limit that comes in its grace)."""
        message = entry.message
        aborted = self._coroutines.abort_reason_of(message)
        settlement, reason = stop_at_time_limit(message, seconds, aborted)  # as the watchdog's
        self._coroutines.cancel(message.queue, message.token, reason, settlement)

    def _watch_the_loop(
        self, loop: asyncio.AbstractEventLoop, now: float, entries: list[RunningCoroutine]
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
