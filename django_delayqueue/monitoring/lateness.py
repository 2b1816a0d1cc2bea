"""How late a queue's handlers start, for the stats (admin, ``queuestats``, health, metrics).

From the delivery timings the consumers flush to Redis (core.timings): p50 and p99 of the start
lateness over the last 5 minutes and the last hour, each interpolated inside its histogram
bucket (so an estimate, within that bucket's width), and the queue's ``lateness_warning_ms``:
a queue whose p99 over the last 5 minutes passes it is flagged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core.settings import lateness_warning_problem
from django_delayqueue.core.timings.reading import TimingWindows


@dataclass(frozen=True)
class LatenessStats:
    """A queue's timings as read (``windows``) and its warning threshold (ms; None: off)."""

    windows: TimingWindows = field(default_factory=TimingWindows)
    warning_ms: float | None = None

    def percentile_ms(self, window: str, q: float) -> float | None:
        """The ``q`` quantile of the start lateness over ``window`` ("5m" or "1h"), ms."""
        counts = self.windows.last_5m if window == "5m" else self.windows.last_hour
        return counts.quantile_ms("lateness", q)

    @property
    def p50_5m(self) -> float | None:
        return self.percentile_ms("5m", 0.5)

    @property
    def p99_5m(self) -> float | None:
        return self.percentile_ms("5m", 0.99)

    @property
    def p50_1h(self) -> float | None:
        return self.percentile_ms("1h", 0.5)

    @property
    def p99_1h(self) -> float | None:
        return self.percentile_ms("1h", 0.99)

    @property
    def flagged(self) -> bool:
        """Whether the p99 over the last 5 minutes passes ``lateness_warning_ms``."""
        p99 = self.p99_5m
        return self.warning_ms is not None and p99 is not None and p99 > self.warning_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "p50_ms_5m": _rounded(self.p50_5m),
            "p99_ms_5m": _rounded(self.p99_5m),
            "p50_ms_1h": _rounded(self.p50_1h),
            "p99_ms_1h": _rounded(self.p99_1h),
            "deliveries_5m": self.windows.last_5m.count("lateness"),
            "deliveries_1h": self.windows.last_hour.count("lateness"),
            "warning_ms": self.warning_ms,
            "flagged": self.flagged,
        }

    @property
    def text_5m(self) -> str:
        return self.summary("5m")

    @property
    def text_1h(self) -> str:
        return self.summary("1h")

    def summary(self, window: str = "5m") -> str:
        """ "p50 1.2 ms, p99 8 ms" (— when nothing was delivered in ``window``)."""
        p50, p99 = self.percentile_ms(window, 0.5), self.percentile_ms(window, 0.99)
        if p50 is None or p99 is None:
            return "—"
        return f"p50 {format_ms(p50)}, p99 {format_ms(p99)}"


def format_ms(ms: float) -> str:
    """A lateness for people: "0.4 ms", "12 ms", "2.5 s"."""
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.2g} ms" if ms < 10 else f"{ms:.0f} ms"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def read_lateness(
    raw: Any, published: dict[str, str], default_warning: float | None
) -> LatenessStats:
    """One queue's (or shard's) lateness from read_timings.lua's reply ``raw`` and its settings
    published to Redis (the admin's; else ``default_warning``, the settings file's)."""
    from django_delayqueue.core.timings.reading import read_result

    return LatenessStats(read_result(raw), published_warning(published, default_warning))


def published_warning(published: dict[str, str], default: float | None) -> float | None:
    """``lateness_warning_ms`` as published (a JSON value), a bad one read as ``default``."""
    if "lateness_warning_ms" not in published:
        return default
    try:
        value = json.loads(published["lateness_warning_ms"])
    except ValueError:
        return default
    return default if lateness_warning_problem(value) else value


def merge_lateness(parts: Sequence[LatenessStats]) -> LatenessStats:
    """A sharded queue's lateness: its shards' timings added up."""
    return LatenessStats(
        TimingWindows.merged([p.windows for p in parts]), parts[0].warning_ms if parts else None
    )
