"""Reading a queue's delivery timings back from Redis: the totals (what Prometheus exports as
counters) and the minutes of the last hour (what the admin's p50/p99 are computed from).

One script call per queue (read_timings.lua), meant to ride in the stats' pipeline. The
windows are whole minutes of the shared clock: "the last 5 minutes" is the current minute
(as flushed so far: consumers flush every few seconds) and the 4 before it, "the last hour"
the current one and the 59 before it. Percentiles are interpolated inside their bucket
(:func:`.buckets.quantile_ms`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import READ_TIMINGS
from django_delayqueue.core.timings.counts import TimingCounts
from django_delayqueue.core.timings.recorder import MINUTE_MS

SHORT_WINDOW_MINUTES = 5
LONG_WINDOW_MINUTES = 60


@dataclass(frozen=True)
class TimingWindows:
    """A queue's timings: since it began, over the last 5 minutes and over the last hour, and
    the minutes of the last hour one by one (the admin's charts), the current one first."""

    total: TimingCounts = field(default_factory=TimingCounts)
    last_5m: TimingCounts = field(default_factory=TimingCounts)
    last_hour: TimingCounts = field(default_factory=TimingCounts)
    minutes: tuple[TimingCounts, ...] = ()

    @classmethod
    def merged(cls, parts: Sequence[TimingWindows]) -> TimingWindows:
        """A sharded queue's timings: its shards' added up (minute by minute too)."""
        longest = max((len(p.minutes) for p in parts), default=0)
        return cls(
            TimingCounts.total(p.total for p in parts),
            TimingCounts.total(p.last_5m for p in parts),
            TimingCounts.total(p.last_hour for p in parts),
            tuple(
                TimingCounts.total(p.minutes[i] for p in parts if i < len(p.minutes))
                for i in range(longest)
            ),
        )


def read_call(keys: QueueKeys, now_ms: int) -> ScriptCall:
    """The call that reads ``keys``' queue's timings as of ``now_ms`` (newest minute first)."""
    minute = now_ms // MINUTE_MS
    minutes = [keys.timings_minute(minute - i) for i in range(LONG_WINDOW_MINUTES)]
    return READ_TIMINGS.call(keys, minutes=minutes)


def read_result(raw: Sequence[Any]) -> TimingWindows:
    """:func:`read_call`'s reply as windows."""
    minutes = [TimingCounts.from_hash(flat) for flat in raw[1:]]
    return TimingWindows(
        TimingCounts.from_hash(raw[0]),
        TimingCounts.total(minutes[:SHORT_WINDOW_MINUTES]),
        TimingCounts.total(minutes),
        tuple(minutes),
    )
