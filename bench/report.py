"""The printed table and the JSON file."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from .harness import Row


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.2f}" if unit == "ms" or abs(value) < 10 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def table(rows: list[Row]) -> str:
    header = ("what", "ours", "baseline", "ratio", "target", "ok")
    lines = [
        (
            row.what,
            _num(row.value, row.unit),
            f"{_num(row.baseline)} ({row.baseline_what})" if row.baseline is not None else "",
            f"{row.ratio:.2f}x" if row.ratio is not None else "",
            row.target,
            {True: "yes", False: "NO", None: ""}[row.ok],
        )
        for row in rows
    ]
    widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header))]
    out = []
    for n, line in enumerate([header, *lines]):
        out.append(
            "  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    notes = [f"- {row.key}: {row.note}" for row in rows if row.note]
    return "\n".join([*out, *(["", *notes] if notes else [])])


def write_json(path: Path, rows: list[Row], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        **meta,
        "rows": [row.to_json() for row in rows],
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
