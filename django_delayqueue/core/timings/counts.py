"""One queue's delivery timings as counts: what a consumer adds up between flushes, what a
minute hash and the totals hash in Redis hold, and what the readers add up again.

The Redis fields (one hash per minute, one for the totals; see ``QueueKeys.timings``):
``l<n>``, ``d<n>``, ``w<n>``: how many start latenesses, handler durations and limit waits fell
in the bucket whose field number is ``n`` (:func:`.buckets.field_of`); ``l_sum``, ``d_sum``,
``w_sum``: their sums in ms; ``o_<outcome>``: deliveries per outcome. Fields at 0 are not written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.timings.buckets import BUCKETS, bucket_of_field, field_of, quantile_ms

# The timings, by name, and the letter of their fields.
HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("lateness", "l"),
    ("duration", "d"),
    ("limit_wait", "w"),
)
# What a delivery ended in: acknowledged, to be retried, dead (garbage: rejected, out of
# attempts, aborted), or stopped (its time limit, an abort or the consumer's stop ended it).
OUTCOMES: tuple[str, ...] = ("ack", "retry", "dead", "stopped")


class TimingCounts:
    """Bucket counts (one list per histogram), their sums (ms) and counts per outcome."""

    __slots__ = ("histograms", "outcomes", "sums")

    def __init__(self) -> None:
        self.histograms: dict[str, list[int]] = {name: [0] * BUCKETS for name, _ in HISTOGRAMS}
        self.sums: dict[str, int] = {name: 0 for name, _ in HISTOGRAMS}
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)

    def __bool__(self) -> bool:
        return any(self.outcomes.values()) or any(
            any(counts) for counts in self.histograms.values()
        )

    def count(self, name: str) -> int:
        """How many readings histogram ``name`` holds."""
        return sum(self.histograms[name])

    def quantile_ms(self, name: str, q: float) -> float | None:
        """The ``q`` quantile of histogram ``name`` (see :func:`.buckets.quantile_ms`)."""
        return quantile_ms(self.histograms[name], q)

    def add(self, other: TimingCounts) -> TimingCounts:
        """Add ``other``'s counts to these (returns self)."""
        for name, _ in HISTOGRAMS:
            mine, theirs = self.histograms[name], other.histograms[name]
            for i, value in enumerate(theirs):
                if value:
                    mine[i] += value
            self.sums[name] += other.sums[name]
        for kind, value in other.outcomes.items():
            self.outcomes[kind] = self.outcomes.get(kind, 0) + value
        return self

    def increments(self) -> list[Any]:
        """The non-zero counts as flat field/increment pairs (record_timings.lua's ARGV)."""
        out: list[Any] = []
        for name, letter in HISTOGRAMS:
            for i, value in enumerate(self.histograms[name]):
                if value:
                    out += (f"{letter}{field_of(i)}", value)
            if self.sums[name]:
                out += (f"{letter}_sum", self.sums[name])
        for kind, value in self.outcomes.items():
            if value:
                out += (f"o_{kind}", value)
        return out

    @classmethod
    def from_hash(cls, flat: Sequence[Any]) -> TimingCounts:
        """Counts from a hash's HGETALL reply (a flat field/value list); unknown fields (a
        later version's) are skipped."""
        counts = cls()
        letters = {letter: name for name, letter in HISTOGRAMS}
        for i in range(0, len(flat) - 1, 2):
            field, value = to_str(flat[i]), int(flat[i + 1])
            if field.startswith("o_"):
                counts.outcomes[field[2:]] = counts.outcomes.get(field[2:], 0) + value
                continue
            name = letters.get(field[:1])
            if name is None:
                continue
            rest = field[1:]
            if rest == "_sum":
                counts.sums[name] += value
            elif rest.isdigit():
                bucket = bucket_of_field(int(rest))
                if bucket is not None:
                    counts.histograms[name][bucket] += value
        return counts

    @classmethod
    def total(cls, parts: Iterable[TimingCounts]) -> TimingCounts:
        """The sum of ``parts`` (a sharded queue's shards, a window's minutes)."""
        out = cls()
        for part in parts:
            out.add(part)
        return out
