"""Telling once that Redis is out of memory, and once that it has room again.

A consumer on a full Redis goes on delivering and acknowledging (see
``scripts/lua/includes/memory.lua``), but its journal rows, recurring ticks and heartbeat
ZADDs, and the outbox's sends, are refused round after round: a log line per refusal would
bury everything else. An :class:`OutOfMemoryLog` logs the first refusal (WARNING), counts the
rest, and logs when a write is taken again.
"""

from __future__ import annotations

import logging
import threading
import time

from django_delayqueue.core.errors import RedisOutOfMemory
from django_delayqueue.core.scripts.calls import is_out_of_memory


class OutOfMemoryLog:
    """Whether writes are being refused for memory, logged on each change only (thread-safe)."""

    def __init__(self, logger: logging.Logger, who: str = "") -> None:
        self.logger = logger
        self.who = who  # names the process or loop in the messages, e.g. a consumer's name
        self.refusals = 0  # writes refused since memory was last seen free
        self.dropped = 0  # journal rows of deliveries given up since then (see recording.py)
        self._since: float | None = None  # monotonic time of the first refusal
        self._lock = threading.Lock()

    @property
    def full(self) -> bool:
        """Whether the last word from Redis was a refusal for memory."""
        return self._since is not None

    def check(self, error: object, what: str, dropped: int = 0) -> bool:
        """Whether ``error`` is a refusal for memory; if so it is counted (``dropped``: journal
        rows given up with it) and, when it is the first since memory was free, logged."""
        if not is_out_of_memory(error):
            return False
        with self._lock:
            first = self._since is None
            if first:
                self._since = time.monotonic()
            self.refusals += 1
            self.dropped += dropped
        if first:
            self.logger.warning(
                "%sRedis is out of memory (used_memory above maxmemory): %s refused. Deliveries "
                "and acks go on and free memory; new messages, journal rows, recurring ticks "
                "and outbox sends wait until it has room (logged once, until then). Raise "
                "maxmemory or let the consumers drain the queues (docs/redis.md). Redis said: %s",
                self._prefix(),
                what,
                # Ours wraps what Redis said (with advice this message gives already).
                error.__cause__ if isinstance(error, RedisOutOfMemory) else error,
            )
        return True

    def taken(self) -> None:
        """A write that needs memory was taken: if writes were refused, say they are no more."""
        with self._lock:
            since, self._since = self._since, None
            refusals, dropped = self.refusals, self.dropped
            self.refusals = self.dropped = 0
        if since is None:
            return
        lost = f"; {dropped} journal row(s) of deliveries were dropped" if dropped else ""
        self.logger.warning(
            "%sRedis has room again after %.0f s out of memory (%d write(s) refused%s)",
            self._prefix(),
            time.monotonic() - since,
            refusals,
            lost,
        )

    def _prefix(self) -> str:
        return f"{self.who}: " if self.who else ""
