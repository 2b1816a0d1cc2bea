"""When a child asks to be recycled: ``--max-messages-per-child`` and ``--max-memory-per-child``."""

from __future__ import annotations

import time
from collections.abc import Callable

from django_delayqueue.core.consumer.details import rss_bytes

MEMORY_CHECK_SECONDS = 1.0  # resident memory is read at most this often (a /proc read)


class RecyclePolicy:
    """Says (once) why a child should be replaced: messages handled, or resident memory."""

    def __init__(
        self,
        max_messages: int | None = None,
        max_memory_mb: float | None = None,
        *,
        read_rss: Callable[[], int | None] = rss_bytes,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_messages = max_messages
        self.max_memory_bytes = None if max_memory_mb is None else int(max_memory_mb * 1024**2)
        self._read_rss = read_rss
        self._monotonic = monotonic
        self._memory_read_at = -float("inf")
        self.asked = False

    def reason(self, handled: int) -> str | None:
        """Why to recycle now (the first time only), or None."""
        if self.asked:
            return None
        why = self._why(handled)
        self.asked = why is not None
        return why

    def _why(self, handled: int) -> str | None:
        if self.max_messages is not None and handled >= self.max_messages:
            return f"handled {handled} message(s) (--max-messages-per-child {self.max_messages})"
        if self.max_memory_bytes is None:
            return None
        now = self._monotonic()
        if now - self._memory_read_at < MEMORY_CHECK_SECONDS:
            return None
        self._memory_read_at = now
        rss = self._read_rss()
        if rss is not None and rss > self.max_memory_bytes:
            return (
                f"resident memory {rss / 1024**2:.0f} MB "
                f"(--max-memory-per-child {self.max_memory_bytes / 1024**2:g})"
            )
        return None
