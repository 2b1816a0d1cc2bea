"""What the queue's operations return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .envelope import decode_envelope
from .errors import CorruptEnvelope


@dataclass(frozen=True)
class ScheduleResult:
    id: str
    created: bool  # False: a message with this id was already waiting; nothing changed
    due_ms: int


@dataclass(frozen=True)
class Rejected:
    index: int
    id: str | None
    reason: str


@dataclass
class BulkResult:
    scheduled: int = 0
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)

    def merge(self, other: BulkResult) -> None:
        self.scheduled += other.scheduled
        self.duplicates += other.duplicates
        self.rejected.extend(other.rejected)


@dataclass(frozen=True)
class PromoteResult:
    moved: int
    more: bool
    next_due_ms: int | None
    ready: int = 0  # length of the ready list afterwards: 0 lets a consumer skip its claim


@dataclass(frozen=True)
class ReapResult:
    retried: int
    buried: int
    more: bool
    next_deadline_ms: int | None


@dataclass(frozen=True)
class Snapshot:
    """Counts per state plus how late the oldest due message is."""

    queue: str
    counts: dict[str, int]
    oldest_overdue_ms: int | None  # None: nothing due is waiting
    next_due_ms: int | None


@dataclass(frozen=True)
class PeekedMessage:
    id: str
    state: str
    score_ms: int | None  # due time, deadline, retry-at or time of death; None for ready
    envelope: str  # raw JSON as stored ('' when missing)
    attempts: int
    reason: str

    @property
    def payload(self) -> Any:
        try:
            return decode_envelope(self.envelope)[2]
        except CorruptEnvelope:
            return None

    @property
    def due_ms(self) -> int | None:
        try:
            return decode_envelope(self.envelope)[0]
        except CorruptEnvelope:
            return None


@dataclass(frozen=True)
class Page:
    total: int
    messages: list[PeekedMessage]
