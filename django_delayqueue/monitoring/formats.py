"""Envelope formats of one queue, for the stats: what waits for a newer consumer, and which
live consumers are older than this process (docs/upgrades.md).

A consumer leaves a message whose envelope format it does not read for a consumer that reads
it (core/delivery.py); the queue's ``newer`` hash counts them (newer_waiting.lua, read in the
stats' round trip). Each consumer announces the newest format it reads with its heartbeat
(core.formats); one whose heartbeat details announce none is of a release before formats had
numbers and reads format 1. Shown by the admin ("3 messages wait for a newer consumer"),
``queuestats``, the health probe and the system check W010.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MOST_ENTRIES = 1000  # entries of the newer hash one stats call looks at (newer_waiting.lua)


@dataclass(frozen=True)
class EnvelopeFormats:
    """``waiting``: messages that wait for a consumer reading a newer format than the one that
    left them (None: not read); ``needed``: the newest format among them; ``consumers``: each
    live consumer's format; ``format``: this process's, what its producers may write."""

    format: int
    waiting: int | None = None
    needed: int | None = None
    consumers: dict[str, int] = field(default_factory=dict)

    @property
    def older(self) -> dict[str, int]:
        """The live consumers that read an older format than this process."""
        return {n: f for n, f in sorted(self.consumers.items()) if f < self.format}

    @property
    def newest_read(self) -> int | None:
        """The newest format a live consumer reads (None: no live consumer)."""
        return max(self.consumers.values(), default=None)

    @property
    def stuck(self) -> bool:
        """Messages wait for a newer consumer and no live consumer reads their format: they
        wait until one that does starts (a consumer is upgraded)."""
        newest = self.newest_read
        return bool(self.waiting) and (newest is None or newest < (self.needed or 0))

    def waiting_text(self) -> str:
        """ "3 messages wait for a newer consumer (envelope format 3; the live consumers read
        up to 2)", or "" when none waits."""
        if not self.waiting:
            return ""
        plural = "message waits" if self.waiting == 1 else "messages wait"
        newest = self.newest_read
        readers = (
            "no consumer is alive" if newest is None else f"the live consumers read up to {newest}"
        )
        return (
            f"{self.waiting} {plural} for a newer consumer (envelope format {self.needed}; "
            f"{readers})"
        )

    def older_text(self) -> str:
        """ "2 live consumers read envelope formats up to 1, older than this release's 2:
        a, b", or "" when none is older."""
        older = self.older
        if not older:
            return ""
        count = f"{len(older)} live consumer{'s' if len(older) > 1 else ''}"
        return (
            f"{count} read envelope formats up to {max(older.values())}, older than this "
            f"release's {self.format}: {', '.join(older)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "waiting_for_newer": self.waiting,
            "newest_needed": self.needed,
            "older_consumers": self.older,
        }


def read_formats(
    format: int, raw: Any, consumers: Sequence[tuple[str, int]], announced: dict[str, int]
) -> EnvelopeFormats:
    """One queue's (or shard's) formats: ``raw`` is newer_waiting.lua's reply (an Exception:
    not read), ``consumers`` the live ones by name, ``announced`` what their heartbeat details
    said (monitoring.processes: 1 for details without a format). A live consumer whose
    details could not be read is left out: nothing is claimed of it (the producers' gate,
    core.formats, holds a feature back for it instead)."""
    waiting = needed = None
    if not isinstance(raw, Exception) and raw is not None:
        waiting, newest = int(raw[0]), int(raw[1])
        needed = newest or None
    live = {name: announced[name] for name, _ in consumers if name in announced}
    return EnvelopeFormats(format, waiting, needed, live)


def merge_formats(parts: Sequence[EnvelopeFormats]) -> EnvelopeFormats:
    """A sharded queue's formats from its shards': waiting added up, a consumer once (with the
    lowest it announced on any shard)."""
    waiting = [p.waiting for p in parts]
    needed = [p.needed for p in parts if p.needed is not None]
    consumers: dict[str, int] = {}
    for p in parts:
        for name, f in p.consumers.items():
            consumers[name] = min(f, consumers.get(name, f))
    return EnvelopeFormats(
        parts[0].format,
        None if any(w is None for w in waiting) else sum(w or 0 for w in waiting),
        max(needed) if needed else None,
        consumers,
    )
