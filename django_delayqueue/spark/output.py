"""Writing the queue report: Parquet (Spark) + CSV + ``summary.json`` + PNG charts.

``out`` is a path or a URI (``hdfs://``, ``s3a://``, ``file://``): Spark writes the Parquet
tables there and the driver writes the rest there through Hadoop's FileSystem API, so the whole
report lands in one place (the admin shows the charts when it is a local directory)::

    summary.json               per-queue figures, chart paths, generation time
    <table>.csv                one file per table (summary, hourly, attempts, errors, ...)
    parquet/<table>/           the same tables as Parquet
    charts/<queue>-lateness.png, charts/<queue>-outcomes.png
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from django_delayqueue.spark.charts import chart_names, lateness_chart, outcomes_chart
from django_delayqueue.spark.report import Report
from django_delayqueue.spark.storage import join, write_bytes, write_text

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
TABLE_COLUMNS = (
    ("queue", "queue"), ("outcomes", "outcomes"), ("ack", "ack"), ("retry", "retry"),
    ("garbage", "garbage"), ("cancel", "cancel"), ("lateness_p50_ms", "p50 ms"),
    ("lateness_p95_ms", "p95 ms"), ("lateness_p99_ms", "p99 ms"), ("lateness_max_ms", "max ms"),
    ("limit_wait_p99_ms", "limit wait p99 ms"),
    ("dead_letter_rate", "dead %"), ("throughput_per_s", "msg/s"), ("top_error", "top error"),
)  # fmt: skip


@dataclass
class ReportResult:
    """What was written (URIs under ``out``), and the collected tables (lists of dicts)."""

    out: str
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def summary(self) -> list[dict[str, Any]]:
        return self.tables.get("summary", [])


def write_report(report: Report, out: str | Path) -> ReportResult:
    """Write every table as Parquet and CSV, draw the charts, write ``summary.json``."""
    root = str(out)
    result = ReportResult(root)
    spark = SparkSession.getActiveSession()
    for name, frame in report.tables().items():
        frame = frame.cache()  # written and collected: compute once
        try:
            frame.write.mode("overwrite").parquet(join(root, "parquet", name))
            rows = [_utc_hour(row.asDict()) for row in frame.collect()]
        finally:
            frame.unpersist()
        result.tables[name] = rows
        csv_text = _csv_text(frame.columns, rows)
        result.files.append(write_text(spark, join(root, f"{name}.csv"), csv_text))
    for chart_name, png in _draw_charts(result.tables):
        result.files.append(write_bytes(spark, join(root, "charts", chart_name), png))
    summary = _summary_json(result.tables)
    result.files.append(write_text(spark, join(root, SUMMARY_FILE), summary))
    logger.info("queue report written to %s (%d files)", root, len(result.files))
    return result


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The per-queue summary as an aligned text table."""
    header = [label for _, label in TABLE_COLUMNS]
    body = [[_cell(row.get(key), key) for key, _ in TABLE_COLUMNS] for row in rows]
    widths = [max(len(x) for x in column) for column in zip(header, *body, strict=True)]
    lines = [header, ["-" * w for w in widths], *body]
    return "\n".join(
        "  ".join(cell.ljust(w) if i in (0, len(widths) - 1) else cell.rjust(w)
                  for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    )  # fmt: skip


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key == "dead_letter_rate":
        return f"{value * 100:.1f}"
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 or value == int(value) else f"{value:.3g}"
    return str(value)


def _csv_text(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_value(row[c]) for c in columns])
    return buffer.getvalue()


def _utc_hour(row: dict[str, Any]) -> dict[str, Any]:
    # PySpark turns timestamps into naive local datetimes; spell the UTC hour from hour_ms.
    if "hour" in row and row.get("hour_ms") is not None:
        row["hour"] = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(row["hour_ms"] / 1000))
    return row


def _csv_value(value: Any) -> Any:
    return "" if value is None else value


def _draw_charts(tables: Mapping[str, list[dict[str, Any]]]) -> list[tuple[str, bytes]]:
    """(file name under charts/, PNG) of every queue's two charts."""
    files: list[tuple[str, bytes]] = []
    for summary in tables["summary"]:
        queue = summary["queue"]
        names = chart_names(queue)
        bins = [b for b in tables["lateness_histogram"] if b["queue"] == queue]
        hours = [h for h in tables["hourly"] if h["queue"] == queue]
        files.append((names["lateness"], lateness_chart(queue, bins, summary)))
        files.append((names["outcomes"], outcomes_chart(queue, hours)))
    return files


def _summary_json(tables: Mapping[str, list[dict[str, Any]]]) -> str:
    queues = {}
    for row in tables["summary"]:
        figures = {k: _json_value(v) for k, v in row.items() if k != "queue"}
        charts = {kind: f"charts/{name}" for kind, name in chart_names(row["queue"]).items()}
        queues[row["queue"]] = {**figures, "charts": charts}
    document = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "queues": queues,
        "tables": sorted(f"{name}.csv" for name in tables),
    }
    return json.dumps(document, indent=2, sort_keys=True)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
