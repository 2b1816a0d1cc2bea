"""The queue page's charts of the last hour, drawn on the server as inline SVG.

From what Redis already keeps and the stats already read (core.timings: the consumers' counts
per minute, kept for an hour): deliveries and failures per minute, start lateness p50 and p99
per minute against ``lateness_warning_ms``, and the time flow limits held messages back. No
JavaScript and nothing fetched: the page works offline. The SVG's colours are the admin's own
CSS variables (base.html), so they follow its light and dark themes. Each chart carries its
figures as a table for screen readers (the SVG is hidden from them).

This module computes what to draw (coordinates, ticks, the table's rows); the template
(admin/django_delayqueue/charts.html) writes the SVG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from django_delayqueue.core.envelope import ms_to_datetime
from django_delayqueue.core.timings.buckets import quantile_ms
from django_delayqueue.core.timings.counts import TimingCounts
from django_delayqueue.core.timings.reading import LONG_WINDOW_MINUTES
from django_delayqueue.core.timings.recorder import MINUTE_MS
from django_delayqueue.monitoring.lateness import format_ms
from django_delayqueue.monitoring.stats import QueueStats

# The drawing's own units: the SVG scales to its box (two charts side by side on a laptop).
WIDTH, HEIGHT = 440, 170
LEFT, RIGHT, TOP, BOTTOM = 50, 8, 10, 24
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
LATENESS_FLOOR_MS = 0.1  # the log scale's bottom: quicker starts are drawn on it
FAILED = ("retry", "dead", "stopped")


def queue_charts(stats: QueueStats, limited: bool) -> list[dict[str, Any]]:
    """The three charts of ``stats``'s queue (``limited``: it has a flow limit)."""
    minutes = _minutes(stats)
    starts = [_minute_start(stats.now_ms, i) for i in range(LONG_WINDOW_MINUTES)]
    warning = stats.lateness.warning_ms if stats.lateness is not None else None
    return [
        _deliveries(minutes, starts),
        _lateness(minutes, starts, warning),
        _limit_waits(minutes, starts, limited),
    ]


def _minutes(stats: QueueStats) -> list[TimingCounts]:
    """The last hour's minutes, oldest first, an empty count where none was read."""
    read = list(stats.lateness.windows.minutes) if stats.lateness is not None else []
    read += [TimingCounts() for _ in range(LONG_WINDOW_MINUTES - len(read))]
    return read[:LONG_WINDOW_MINUTES][::-1]


def _minute_start(now_ms: int, i: int) -> datetime:
    """When minute ``i`` (0: the oldest of the hour) began, in the current time zone."""
    first = now_ms // MINUTE_MS - (LONG_WINDOW_MINUTES - 1)
    moment = ms_to_datetime((first + i) * MINUTE_MS)
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


def _x(i: float) -> float:
    return round(LEFT + PLOT_W * i / LONG_WINDOW_MINUTES, 1)


def _frame() -> dict[str, Any]:
    """What every chart shares: its size, the plot's box, the time axis."""
    bottom = TOP + PLOT_H
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": TOP,
        "bottom": bottom,
        "x_ticks": [
            {"x": _x(i + 0.5), "label": "now" if i == 59 else f"-{60 - i} min", "y": bottom + 16}
            for i in (0, 15, 30, 45, 59)
        ],
    }


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2 or 5 times 10^k at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def _linear_axis(top_value: float, unit: Callable[[float], str]) -> tuple[Any, list[Any]]:
    """A y scale from 0 to a round ``top_value``, and its ticks (0, half, top)."""
    top_value = _nice_ceiling(top_value)

    def y(value: float) -> float:
        return round(TOP + PLOT_H * (1 - value / top_value), 1)

    ticks = [{"y": y(v), "label": unit(v)} for v in (0, top_value / 2, top_value)]
    return y, ticks


def _bars(
    values: Sequence[float], y: Callable[[float], float], base: Sequence[float] | None = None
) -> list[dict[str, float]]:
    """One bar per minute with a value, stacked on ``base`` if given."""
    width = round(PLOT_W / LONG_WINDOW_MINUTES - 1, 1)
    out = []
    for i, value in enumerate(values):
        if value <= 0:
            continue
        below = base[i] if base is not None else 0
        top, bottom = y(below + value), y(below)
        out.append({"x": _x(i) + 0.5, "y": top, "width": width, "height": round(bottom - top, 1)})
    return out


def _count_label(value: float) -> str:
    return f"{value:g}"


def _deliveries(minutes: list[TimingCounts], starts: list[datetime]) -> dict[str, Any]:
    ok = [m.outcomes.get("ack", 0) for m in minutes]
    failed = [sum(m.outcomes.get(k, 0) for k in FAILED) for m in minutes]
    y, ticks = _linear_axis(
        max((a + b for a, b in zip(ok, failed, strict=True)), default=0), _count_label
    )
    rows = [
        [f"{start:%H:%M}", str(ok[i]), str(failed[i]), *(str(m.outcomes.get(k, 0)) for k in FAILED)]
        for i, (start, m) in enumerate(zip(starts, minutes, strict=True))
        if ok[i] or failed[i]
    ]
    total_ok, total_failed = sum(ok), sum(failed)
    return {
        **_frame(),
        "kind": "deliveries",
        "title": "Deliveries per minute",
        "summary": f"{total_ok} delivered and {total_failed} failed in the last hour",
        "y_ticks": ticks,
        "series": [
            {"name": "delivered", "class": "dq-chart-ok", "bars": _bars(ok, y)},
            {
                "name": "failed (retried, dead or stopped)",
                "class": "dq-chart-failed",
                "bars": _bars(failed, y, ok),
            },
        ],
        "columns": ["Minute", "Delivered", "Failed", "Retried", "Dead", "Stopped"],
        "rows": rows,
        "empty": "No deliveries in the last hour.",
    }


def _lateness(
    minutes: list[TimingCounts], starts: list[datetime], warning: float | None
) -> dict[str, Any]:
    p50 = [m.quantile_ms("lateness", 0.5) for m in minutes]
    p99 = [m.quantile_ms("lateness", 0.99) for m in minutes]
    highest = max([v for v in p99 if v is not None] + [warning or 0, 1.0])
    decades = range(-1, math.ceil(math.log10(highest)) + 1)  # 0.1 ms, 1 ms, 10 ms...
    low, high = math.log10(LATENESS_FLOOR_MS), decades[-1]

    def y(ms: float) -> float:
        value = math.log10(max(ms, LATENESS_FLOOR_MS))
        return round(TOP + PLOT_H * (1 - (value - low) / (high - low)), 1)

    ticks = [{"y": y(10.0**d), "label": format_ms(10.0**d)} for d in decades]
    series = []
    for name, css, values in (("p50", "dq-chart-p50", p50), ("p99", "dq-chart-p99", p99)):
        points = [(_x(i + 0.5), y(v)) for i, v in enumerate(values) if v is not None]
        series.append(
            {
                "name": name,
                "class": css,
                "points": [{"x": px, "y": py} for px, py in points],
                "lines": _segments(
                    [None if v is None else (_x(i + 0.5), y(v)) for i, v in enumerate(values)]
                ),
            }
        )
    rows = [
        [
            f"{start:%H:%M}",
            str(minutes[i].count("lateness")),
            format_ms(p50[i] or 0),
            format_ms(p99[i] or 0),
        ]
        for i, start in enumerate(starts)
        if p50[i] is not None
    ]
    late = sum(1 for v in p99 if v is not None and warning is not None and v > warning)
    summary = "no handler started in the last hour"
    if rows:
        summary = (
            f"p99 above the warning in {late} of {len(rows)} minutes"
            if warning is not None
            else f"{len(rows)} minutes with deliveries; no lateness_warning_ms set"
        )
    return {
        **_frame(),
        "kind": "lateness",
        "title": "Start lateness per minute (p50, p99)",
        "summary": summary,
        "y_ticks": ticks,
        "series": series,
        "warning": None
        if warning is None
        else {"y": y(warning), "label": f"warning {format_ms(warning)}"},
        "columns": ["Minute", "Started", "p50", "p99"],
        "rows": rows,
        "empty": "No handler started in the last hour.",
    }


def _segments(points: Sequence[tuple[float, float] | None]) -> list[str]:
    """SVG polyline ``points`` strings for each run of consecutive minutes with a value."""
    runs: list[list[tuple[float, float]]] = [[]]
    for p in points:
        if p is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(p)
    return [" ".join(f"{x},{y}" for x, y in run) for run in runs if len(run) > 1]


def _limit_waits(
    minutes: list[TimingCounts], starts: list[datetime], limited: bool
) -> dict[str, Any]:
    held_s = [m.sums["limit_wait"] / 1000 for m in minutes]
    # Readings are whole ms: the first bucket (up to 0.25 ms) holds the messages not held.
    held_n = [m.count("limit_wait") - m.histograms["limit_wait"][0] for m in minutes]
    y, ticks = _linear_axis(max(held_s, default=0), lambda v: f"{v:g} s")
    rows = [
        [
            f"{start:%H:%M}",
            str(held_n[i]),
            f"{held_s[i]:.1f} s",
            format_ms(quantile_ms(minutes[i].histograms["limit_wait"], 0.99) or 0),
        ]
        for i, start in enumerate(starts)
        if held_n[i]
    ]
    summary = (
        f"{sum(held_n)} messages held, {sum(held_s):.1f} s in all, in the last hour"
        if limited
        else "no flow limit is set: nothing is held"
    )
    return {
        **_frame(),
        "kind": "limit-wait",
        "title": "Time held by flow limits per minute",
        "summary": summary,
        "y_ticks": ticks,
        "series": [
            {
                "name": "seconds held (all messages)",
                "class": "dq-chart-held",
                "bars": _bars(held_s, y),
            }
        ],
        "columns": ["Minute", "Messages held", "Held in all", "p99 wait"],
        "rows": rows,
        "empty": "Nothing held by a flow limit in the last hour."
        if limited
        else "This queue has no flow limit.",
    }
