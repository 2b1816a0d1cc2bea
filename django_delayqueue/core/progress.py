"""A running delivery's progress: what a handler reports, checked, and how Redis stores it.

A handler (or task) says how far it got with ``message.progress(percent, note)`` or
``dq.progress(percent, note)``; the consumer sends the latest report of each running message with
its next beat (core/consumer/handlers/progress_reports.py), and ``progress.lua`` stores it in the
queue's ``progress`` hash (id -> the JSON below) for the delivery holding the current token. Readers
(the admin, ``queuestats``, a task's ``get_progress``) decode it here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_delayqueue.core.envelope import ms_to_datetime, to_str

# The check of a report lives with what a handler may ask (core/running.py), which the
# envelope's Message.progress reaches without this module (it imports the envelope); kept
# importable from here for its callers.
from django_delayqueue.core.running import MAX_NOTE_CHARS, checked_progress

__all__ = [
    "MAX_NOTE_CHARS",
    "Progress",
    "checked_progress",
    "decode_progress",
    "encode_progress",
]


@dataclass(frozen=True)
class Progress:
    """The last progress a running delivery reported: ``percent`` (0 to 100), ``note``, and
    when the consumer sent it (``at_ms``, the Redis server's clock)."""

    percent: float
    note: str = ""
    at_ms: int = 0

    @property
    def at(self) -> datetime:
        return ms_to_datetime(self.at_ms)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``queuestats --json``)."""
        return {"percent": self.percent, "note": self.note, "at": self.at.isoformat()}


def encode_progress(percent: float, note: str, at_ms: int) -> str:
    """The ``progress`` hash value of a checked report, sent at ``at_ms``."""
    return json.dumps({"p": percent, "n": note, "at": at_ms}, ensure_ascii=False)


def decode_progress(raw: bytes | str | None) -> Progress | None:
    """A ``progress`` hash value as :class:`Progress`; None for a missing or unreadable one."""
    if raw is None:
        return None
    try:
        data = json.loads(to_str(raw))
        return Progress(float(data["p"]), str(data.get("n") or ""), int(data.get("at") or 0))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
