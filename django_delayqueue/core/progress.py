"""A running delivery's progress: what a handler reports, checked, and how Redis stores it.

A handler (or task) says how far it got with ``message.progress(percent, note)`` or
``dq.progress(percent, note)``; the consumer sends the latest report of each running message
with its next beat (core/consumer/progress_reports.py), and ``progress.lua`` stores it in the
queue's ``progress`` hash (id -> the JSON below) for the delivery holding the current token.
Readers (the admin, ``queuestats``, a task's ``get_progress``) decode it here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_delayqueue.core.envelope import ms_to_datetime, to_str

# A note is a short status line for a table cell ("row 4,000 of 9,000"), not a log: a longer
# one is cut here (with an ellipsis) rather than refused, so that a handler never fails over
# the length of an f-string holding a file name.
MAX_NOTE_CHARS = 200


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


def checked_progress(percent: Any, note: Any = "") -> tuple[float, str]:
    """``(percent, note)`` as stored: ``percent`` a real number from 0 to 100 (a bool, NaN or
    anything else is a ValueError naming it), ``note`` a str cut to ``MAX_NOTE_CHARS``."""
    if isinstance(percent, bool) or not isinstance(percent, (int, float)):
        raise ValueError(f"progress percent must be a number from 0 to 100, not {percent!r}")
    value = float(percent)
    if not (math.isfinite(value) and 0.0 <= value <= 100.0):
        raise ValueError(f"progress percent must be from 0 to 100, not {percent!r}")
    if not isinstance(note, str):
        raise ValueError(f"progress note must be a str, not {type(note).__name__}")
    if len(note) > MAX_NOTE_CHARS:
        note = note[: MAX_NOTE_CHARS - 1] + "…"
    # A lone surrogate (a file name read with surrogateescape) could not be sent to Redis.
    if not note.isascii():
        note = note.encode("utf-8", "backslashreplace").decode()
    return value, note


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
