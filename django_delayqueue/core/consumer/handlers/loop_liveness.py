"""The coroutines' event loop, asked for a sign of life at each look of the watchdog.

A coroutine that blocks the loop in sync code stops every coroutine on it; nothing on the loop
can tell. So while coroutines run, the watchdog (:mod:`.limits.watchdog`, which keeps their time
limits as it keeps the threads') looks at the loop too (:meth:`LoopLiveness.look`): it asks the
loop for a sign of life (a callback run on it) and logs, once, a loop that has given none for
:data:`BLOCKED_WARN_SECONDS`. No thread of its own: the watchdog's look, every
:data:`PING_SECONDS` while coroutines run.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from django_delayqueue.core.consumer.handlers.coroutine_context import RunningCoroutine

logger = logging.getLogger(__name__)

# How often the loop is asked for a sign of life while coroutines run, and after how long
# without one it is said to be blocked.
PING_SECONDS = 0.25
BLOCKED_WARN_SECONDS = 2.0


class LoopLiveness:
    """Pings the loop that ``watched()`` gives (the loop, None before it started, and the
    coroutines running on it: ``HandlerCoroutines.watched``), on the watchdog's thread and its
    clock; the loop's thread only counts the answers."""

    def __init__(
        self,
        watched: Callable[[], tuple[asyncio.AbstractEventLoop | None, list[RunningCoroutine]]],
    ) -> None:
        self._watched = watched
        # Each written by one thread only (pings: the watchdog's, pongs: the loop's): no lock.
        self._pings = 0
        self._pongs = 0
        self._alive_at: float | None = None  # when it last answered every ping (None: idle)
        self._said_blocked = False

    def look(self, now: float) -> float:
        """Ping the loop, warn if it has been silent; returns when (``now``'s clock) to look
        again: soon while coroutines run, never while none does."""
        loop, entries = self._watched()
        if loop is None or not entries:
            self._alive_at = None  # silence while nothing runs is no sign of a blocked loop
            self._said_blocked = False
            return math.inf
        if self._alive_at is None or self._pongs == self._pings:
            self._alive_at = now  # every ping answered: alive
            self._said_blocked = False
        silent = now - self._alive_at
        if silent >= BLOCKED_WARN_SECONDS and not self._said_blocked:
            self._said_blocked = True
            logger.warning(
                "the event loop of the coroutine handlers has not run for %.1fs: a coroutine "
                "blocks it in sync code (use await, or sync_to_async); %d coroutine(s) wait: %s",
                silent,
                len(entries),
                ", ".join(f"{e.message.queue}/{e.message.id}" for e in entries[:10]),
            )
        if self._pongs == self._pings:
            self._pings += 1
            try:
                loop.call_soon_threadsafe(self._pong)
            except RuntimeError:  # closed meanwhile: nothing left to watch
                self._pings -= 1
        return now + PING_SECONDS

    def _pong(self) -> None:
        """On the loop's thread: it runs."""
        self._pongs += 1
