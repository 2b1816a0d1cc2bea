"""What rides on a consumer's round trip besides the promotes and claims: one interface.

Two parts add calls to every round trip's pipeline and read their replies: the outcomes waiting
to be recorded (:class:`~.rounds.recording.UnrecordedOutcomes`) and the recurring schedules
(:class:`~django_delayqueue.core.recurring.keeper.ScheduleKeeper`). Both are a
:class:`RoundPart`. The keeper answers a few questions more (:class:`Keeper`): whether a queue's
promote and claim must wait for it, when it needs a round, what a finished tick leaves to write.
A consumer that keeps no recurring schedules has :class:`NoKeeper`, whose every answer is
"nothing", so the round trip never asks whether there is a keeper.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptBatch, ScriptCall

logger = logging.getLogger(__name__)


class RoundPart(Protocol):
    """Calls sent with every round trip, one Redis server's queues at a time."""

    # "Redis is out of memory" is logged once for the whole consumer: it shares one log.
    memory: OutOfMemoryLog

    def add_to(self, batch: ScriptBatch, queues: Sequence[Queue], now_ms: int) -> Any:
        """Add this round's calls for ``queues`` (those of one server) to ``batch``; returns
        what :meth:`read` needs to find their replies."""
        ...

    def read(self, sent: Any, results: Sequence[Any], now_ms: int) -> None:
        """Take in the replies to ``sent`` (``results`` holds the whole batch's). Does not
        raise: the claims of the same round must reach their handlers."""
        ...


class Keeper(RoundPart, Protocol):
    """A round part that keeps recurring schedules (see ``core/recurring/keeper.py``)."""

    def holds(self, q: Queue, now_ms: int) -> bool:
        """Whether ``q``'s promote and claim wait for the round that reads its schedules."""
        ...

    def needs_round(self, now_ms: int) -> bool:
        """Whether the next round should not wait (states to read, a change to make)."""
        ...

    def next_due(self) -> int | None:
        """When a round must run for a schedule (ms), or None."""
        ...

    def finished(self, q: Queue, outcome: Outcome) -> ScriptCall | None:
        """What to write about a finished delivery of ``q`` (a tick's run), or None. Called
        on the handler thread; what it returns goes with the next round trip."""
        ...


class NoKeeper:
    """The keeper of a consumer without recurring schedules: it adds nothing to a round."""

    def __init__(self) -> None:
        self.memory = OutOfMemoryLog(logger)

    def add_to(self, batch: ScriptBatch, queues: Sequence[Queue], now_ms: int) -> None:
        return None

    def read(self, sent: Any, results: Sequence[Any], now_ms: int) -> None:
        return None

    def holds(self, q: Queue, now_ms: int) -> bool:
        return False

    def needs_round(self, now_ms: int) -> bool:
        return False

    def next_due(self) -> int | None:
        return None

    def finished(self, q: Queue, outcome: Outcome) -> ScriptCall | None:
        return None
