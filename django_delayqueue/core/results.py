"""What the queue's operations return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.errors import CorruptEnvelope


class Prepared(NamedTuple):
    """One message checked and encoded by ``Queue.prepare``, ready for ``send_prepared``."""

    id: str
    due_ms: int
    envelope: str


@dataclass(frozen=True)
class ScheduleResult:
    """What became of one scheduled message.

    ``state`` is the state of the message that already held the id (``"pending"``,
    ``"ready"``, ``"unack"``, ``"retry"`` or ``"garbage"``), None when the id was free. Without
    ``replace`` a taken id means nothing was created (``created`` False); with ``replace=True``
    the message is always stored: it replaced the one in ``state``, or, for ``"unack"``, became
    the successor that the running delivery's ack schedules.

    ``unique_until_ms`` is set when a schedule with ``unique_for`` was refused because the id's
    uniqueness window is open: when that window ends (ms, Redis clock). Nothing was created,
    and ``state`` is None if the message that opened the window is gone (acknowledged,
    cancelled, purged).
    """

    id: str
    created: bool  # the message was stored (new, replacing, or as a successor)
    due_ms: int
    state: str | None = None
    unique_until_ms: int | None = None

    @property
    def within_window(self) -> bool:
        """Refused: a schedule with ``unique_for`` found the id's uniqueness window open."""
        return self.unique_until_ms is not None

    @property
    def replaced(self) -> bool:
        """Stored over a message that held the id (or as its successor)."""
        return self.created and self.state is not None

    @property
    def successor(self) -> bool:
        """Stored to follow a delivery in flight: scheduled when that one is acknowledged."""
        return self.created and self.state == "unack"


@dataclass(frozen=True)
class Rejected:
    index: int
    id: str | None
    reason: str


@dataclass
class BulkResult:
    scheduled: int = 0  # new messages under free ids
    already_present: int = 0  # not created: the id was taken and replace was not asked for
    rejected: list[Rejected] = field(default_factory=list)  # invalid: not sent
    replaced: int = 0  # stored with replace over a message holding the id (or as a successor)
    # Valid, but not stored: Redis was out of memory (see RedisOutOfMemory). Nothing of them
    # was written; send them again (with their ids) once it has room.
    not_scheduled: list[Rejected] = field(default_factory=list)
    # Not created: an item with ``unique_for`` found its id's uniqueness window open.
    within_window: int = 0

    def merge(self, other: BulkResult) -> None:
        self.scheduled += other.scheduled
        self.within_window += other.within_window
        self.already_present += other.already_present
        self.replaced += other.replaced
        self.rejected.extend(other.rejected)
        self.not_scheduled.extend(other.not_scheduled)


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


@dataclass(frozen=True)
class AbortResult:
    """What ``abort`` found: truthy when the message was in flight (running, or claimed and
    about to run) and the abort is recorded; else the state it was in, and nothing changed."""

    queue: str
    message_id: str
    state: str  # "unack" (recorded), or "pending", "ready", "retry", "garbage", "" (gone)

    @property
    def running(self) -> bool:
        return self.state == "unack"

    def __bool__(self) -> bool:
        return self.running

    @property
    def message(self) -> str:
        """One sentence for a log or the admin."""
        what = f"message {self.message_id!r} of queue {self.queue!r}"
        if self.running:
            return f"{what} is asked to stop; it goes to the dead letters"
        if not self.state:
            return f"{what} is not running: there is no such message (done, or never scheduled)"
        where = {
            "pending": "waiting for its due time (cancel it instead)",
            "ready": "due and waiting for a consumer (cancel it instead)",
            "retry": "waiting to retry (cancel it instead)",
            "garbage": "in the dead letters already",
        }.get(self.state, self.state)
        return f"{what} is not running: it is {where}"
