"""PNG charts of the queue report, drawn with matplotlib's Agg backend (no display needed).

Each is returned as PNG bytes; the report writes them as ``<queue>-lateness.png`` and
``<queue>-outcomes.png`` in its ``charts/`` directory (predictable names the admin links to).
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from django_delayqueue.spark.chart_files import chart_names

__all__ = ["chart_names", "lateness_chart", "outcomes_chart"]

COLOURS = {"ack": "#2e7d32", "retry": "#f9a825", "garbage": "#c62828", "cancel": "#78909c"}


def lateness_chart(
    queue: str, bins: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> bytes:
    """Histogram of first-delivery lateness, with p50/p95/p99 marked."""
    fig = Figure(figsize=(7, 3.5), dpi=100)
    ax = fig.add_subplot()
    if bins:
        lowers = [b["lower_ms"] for b in bins]
        widths = [b["upper_ms"] - b["lower_ms"] for b in bins]
        ax.bar(lowers, [b["count"] for b in bins], width=widths, align="edge", color="#1565c0")
        for name, style in (("p50", ":"), ("p95", "--"), ("p99", "-")):
            value = summary.get(f"lateness_{name}_ms")
            if value is not None:
                ax.axvline(value, color="black", linestyle=style, linewidth=1, label=name)
        ax.legend(loc="upper right")
    else:
        ax.text(0.5, 0.5, "no first deliveries", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"{queue}: lateness of first deliveries (last bin: p99 and above)")
    ax.set_xlabel("delivered - due (ms)")
    ax.set_ylabel("deliveries")
    return _png(fig)


def outcomes_chart(queue: str, hours: Sequence[Mapping[str, Any]]) -> bytes:
    """Outcomes per UTC hour, stacked."""
    fig = Figure(figsize=(7, 3.5), dpi=100)
    ax = fig.add_subplot()
    labels = [time.strftime("%m-%d %H:00", time.gmtime(h["hour_ms"] / 1000)) for h in hours]
    positions = list(range(len(hours)))
    bottom = [0] * len(hours)
    for outcome, colour in COLOURS.items():
        values = [int(h[outcome] or 0) for h in hours]
        ax.bar(positions, values, bottom=bottom, color=colour, label=outcome)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    step = max(1, len(labels) // 12)
    ax.set_xticks(positions[::step], labels[::step], rotation=30, ha="right", fontsize=8)
    ax.set_title(f"{queue}: outcomes per hour (UTC)")
    ax.set_ylabel("messages")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # beside the bars
    return _png(fig)


def _png(fig: Figure) -> bytes:
    fig.tight_layout()
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()
