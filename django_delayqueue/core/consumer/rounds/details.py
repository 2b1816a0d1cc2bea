"""What a consumer's heartbeat says about its process, for ``queuestats``, health and the admin.

Written once per maintenance round with the heartbeat (no round trip of its own, nothing per
message): one JSON value per queue in that queue's ``consumer_details`` hash, holding the
process (pid, host, supervisor, messages handled, resident memory), the newest envelope format
it reads (``reads_format``: what producers and the checks read, core.formats) and the handlers
running on *that* queue now, at most :data:`MOST_RUNNING_LISTED` of them (the count is always
whole), so a value stays small whatever the concurrency.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from django_delayqueue.core.consumer.handlers.contracts import RunningHandler
from django_delayqueue.core.envelope import ENVELOPE_FORMAT

MOST_RUNNING_LISTED = 20
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HOST = socket.gethostname()


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc/self/statm``), or None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def heartbeat_details(
    queue: str,
    handled: int,
    running: Sequence[RunningHandler],
    supervisor: Mapping[str, Any] | None = None,
    *,
    reads_format: int = ENVELOPE_FORMAT,
) -> str:
    """The JSON a consumer writes beside its heartbeat on ``queue``: its process, the newest
    envelope format it reads, and the handlers of ``queue`` (a physical queue: a shard's own
    name) running now, oldest first."""
    mine = sorted((r for r in running if r.message.queue == queue), key=lambda r: r.started_ms)
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": _HOST,
            "supervisor": dict(supervisor) if supervisor else None,
            "handled": handled,
            "rss_bytes": rss_bytes(),
            "reads_format": reads_format,
            "running_count": len(mine),
            "running": [
                {"id": r.message.id, "attempt": r.message.attempt, "started_ms": r.started_ms}
                for r in mine[:MOST_RUNNING_LISTED]
            ],
        },
        separators=(",", ":"),
    )
