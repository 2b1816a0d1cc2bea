"""The bulk scheduling job as plain data, so that it runs the same from ``manage.py
schedule_bulk`` and from ``spark-submit`` with no Django project on the driver.

``manage.py schedule_bulk ... --write-job job.json`` writes the job (the Redis URL, the key
prefix and the queue's payload limit resolved from the Django settings); ``spark-submit ...
django_delayqueue/spark/submit.py schedule --job job.json`` runs it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from django_delayqueue.spark.bulk import BulkSummary, read_input, schedule_dataframe
from django_delayqueue.spark.progress import ProgressCallback
from django_delayqueue.spark.transforms import MessageSpec


@dataclass
class ScheduleJob:
    """Everything a bulk run needs, none of it from Django."""

    input: str
    format: str
    queue: str
    prefix: str
    redis_url: str
    spec: dict[str, Any]  # MessageSpec fields
    rejects: str | None = None
    rejects_format: str = "json"
    chunk_size: int = 500
    partitions: int | None = None
    redis_cluster: bool = False  # redis_url names a node of a Redis Cluster
    shards: int = 1  # the queue's "shards" setting

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ScheduleJob:
        data = json.loads(text)
        data["spec"] = {k: tuple(v) if isinstance(v, list) else v for k, v in data["spec"].items()}
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> ScheduleJob:
        return cls.from_json(Path(path).read_text())


def guess_format(path: str) -> str:
    """The input format from a path's or URI's extension (parquet when there is none)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return {"csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json"}.get(suffix, "parquet")


def run_schedule_job(
    spark: SparkSession, job: ScheduleJob, on_progress: ProgressCallback | None = None
) -> BulkSummary:
    """Read ``job.input`` and schedule every row (the rejects to ``job.rejects``)."""
    df = read_input(spark, job.input, job.format)
    return schedule_dataframe(
        df,
        job.redis_url,
        job.prefix,
        job.queue,
        MessageSpec(**job.spec),
        rejects_path=job.rejects,
        rejects_format=job.rejects_format,
        chunk_size=job.chunk_size,
        partitions=job.partitions,
        on_progress=on_progress,
        redis_cluster=job.redis_cluster,
        shards=job.shards,
    )


def summary_lines(queue: str, summary: BulkSummary, rejects: str | None) -> list[str]:
    """The summary a person reads: counts, rejects by reason, where they went."""
    lines = [
        f"queue {queue}: {summary.scheduled} scheduled, {summary.already_present} already "
        f"present, {summary.rejected} rejected{_in_window(summary)} (of {summary.total} rows, "
        f"{summary.partitions} partitions) in {summary.seconds:.1f}s"
    ]
    for reason, count in sorted(summary.reasons.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:>10}  {reason}")
    if summary.rejected and rejects:
        lines.append(f"rejected rows written to {rejects}")
    return lines


def _in_window(summary: BulkSummary) -> str:
    """ ", N within their uniqueness window" when rows had windows that kept some out."""
    return f", {summary.within_window} within their window" if summary.within_window else ""
