"""supervisor/memory.py: when a child asks to be recycled (once)."""

from __future__ import annotations

from django_delayqueue.core.consumer.details import rss_bytes
from django_delayqueue.supervisor.memory import MEMORY_CHECK_SECONDS, RecyclePolicy


def test_by_message_count_once() -> None:
    policy = RecyclePolicy(max_messages=3)
    assert policy.reason(2) is None
    assert "--max-messages-per-child 3" in (policy.reason(3) or "")
    assert policy.reason(10) is None  # asked already: the supervisor is replacing it


def test_by_resident_memory_read_at_most_once_a_second() -> None:
    now = [100.0]
    reads: list[int] = []
    rss = [50 * 1024**2]

    def read() -> int:
        reads.append(1)
        return rss[0]

    policy = RecyclePolicy(max_memory_mb=100, read_rss=read, monotonic=lambda: now[0])
    assert policy.reason(0) is None
    rss[0] = 150 * 1024**2
    assert policy.reason(0) is None and len(reads) == 1  # not read again within the second
    now[0] += MEMORY_CHECK_SECONDS
    assert policy.reason(0) == "resident memory 150 MB (--max-memory-per-child 100)"


def test_nothing_asked_without_limits() -> None:
    assert RecyclePolicy().reason(10**9) is None


def test_this_process_has_a_resident_size() -> None:
    assert (rss_bytes() or 0) > 1024**2
