"""When a child asks to be recycled: ``--max-messages-per-child`` and ``--max-memory-per-child``;
and the least a consumer process can weigh, below which a memory limit is refused at start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from django_delayqueue.core.consumer.rounds.details import rss_bytes

MEMORY_CHECK_SECONDS = 1.0  # resident memory is read at most this often (a /proc read)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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
        self.for_memory = False  # what it asked for was --max-memory-per-child

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
            self.for_memory = True
            return (
                f"resident memory {rss / 1024**2:.0f} MB "
                f"(--max-memory-per-child {self.max_memory_bytes / 1024**2:g})"
            )
        return None


def own_memory_bytes() -> int | None:
    """This process's own resident memory (Linux ``/proc/self/statm``: resident pages less
    those shared with files), or None elsewhere.

    The least a consumer process of this runqueue weighs: one forked from it holds these pages
    as its own (their page tables are copied: they count in its resident memory, where the
    file pages it shares count only once it touches them), and a fresh interpreter (after a
    SIGHUP) loads the same project. Its whole resident size is not that bound: a forked child
    measured less than its supervisor's.
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def memory_limit_problem(max_memory_mb: float, own_bytes: int | None) -> str | None:
    """Why ``--max-memory-per-child max_memory_mb`` cannot work with consumer processes of at
    least ``own_bytes`` (:func:`own_memory_bytes`), or None (None too when unknown)."""
    if own_bytes is None or max_memory_mb * 1024**2 > own_bytes:
        return None
    own_mb = own_bytes / 1024**2
    return (
        f"--max-memory-per-child {max_memory_mb:g} is below the memory every consumer process "
        f"starts with: this runqueue holds {own_mb:.0f} MB of its own after setup, and each "
        "consumer process holds as much from its start (forked from it, or a fresh "
        "interpreter of the same project after a SIGHUP), so each would ask to be replaced as "
        f"soon as it started. Give more than {own_mb:.0f} MB, with room for what your "
        "handlers use (a consumer's resident memory is in queuestats and the admin)."
    )
