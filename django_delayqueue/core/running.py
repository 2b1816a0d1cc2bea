"""What a running handler may ask about its delivery: whether it was aborted
(``message.aborted``), and to report how far it got (``message.progress``), with the check of
what it reports.

The consumer knows the answers (which handlers run in this process, which of them were
aborted, where a report waits to be sent), but :class:`~django_delayqueue.core.envelope.Message`
may not import it: the consumer imports the envelope, so the other way round closes an import
cycle. So the envelope asks here, and the consumer registers what answers
(:func:`register`, done as ``django_delayqueue.core.consumer`` is imported, before any of its
handlers can run). Until then no handler runs in this process: a delivery is not aborted and a
report goes nowhere (False), though a bad one is refused all the same (ValueError).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from django_delayqueue.core.envelope import Message

# A note is a short status line for a table cell ("row 4,000 of 9,000"), not a log: a longer
# one is cut here (with an ellipsis) rather than refused, so that a handler never fails over
# the length of an f-string holding a file name.
MAX_NOTE_CHARS = 200


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


class HandlerAnswers(Protocol):
    """What answers a running handler's questions: the consumer of this process."""

    def abort_requested(self, message: Message) -> bool:
        """Whether an abort of this delivery of ``message`` reached its consumer."""
        ...

    def progress(self, message: Message, percent: Any, note: Any) -> bool:
        """Keep a report of this delivery of ``message`` for its consumer to send (checked:
        ValueError for a bad one); False when it does not run in this process."""
        ...


class NoHandlerRuns:
    """The answers before a consumer registered its own: no handler runs in this process."""

    def abort_requested(self, message: Message) -> bool:
        return False

    def progress(self, message: Message, percent: Any, note: Any) -> bool:
        checked_progress(percent, note)  # refused outside a handler too, as inside one
        return False


_answers: HandlerAnswers = NoHandlerRuns()


def register(answers: HandlerAnswers) -> None:
    """Let ``answers`` (the consumer's) answer every running handler of this process."""
    global _answers
    _answers = answers


def abort_requested(message: Message) -> bool:
    """``message.aborted``: whether an abort of this delivery reached its consumer."""
    return _answers.abort_requested(message)


def progress(message: Message, percent: Any, note: Any = "") -> bool:
    """``message.progress``: report how far the handler of this delivery got (see there)."""
    return _answers.progress(message, percent, note)
