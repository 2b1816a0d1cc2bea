"""Where the queue report's charts live, spelled once for the Spark job and the admin.

``queue_report --out DIR`` draws ``DIR/charts/<queue>-<kind>.png``; with
``DELAYQUEUE["REPORT_DIR"] = DIR`` the admin's queue page shows them. Django-free, and free of
matplotlib, so the admin can use it without the ``spark`` extra.
"""

from __future__ import annotations

from pathlib import Path

CHART_KINDS = ("lateness", "outcomes")


def chart_names(queue: str) -> dict[str, str]:
    """Chart file names of ``queue``, relative to the report's ``charts/`` directory."""
    return {kind: f"{queue}-{kind}.png" for kind in CHART_KINDS}


def chart_path(report_dir: str | Path, queue: str, kind: str) -> Path | None:
    """The chart file if the report has drawn it, else None (unknown kinds included)."""
    name = chart_names(queue).get(kind)
    if name is None:
        return None
    path = Path(report_dir) / "charts" / name
    return path if path.is_file() else None
