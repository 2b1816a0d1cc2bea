"""``manage.py schedule_bulk``: schedule every row of a dataset as a message (Spark job)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.conf.queues import queue_settings
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError
from django_delayqueue.management.commands._spark import (
    add_redis_argument,
    add_spark_arguments,
    redis_url,
    spark_session,
    split_columns,
)

FORMATS = ("parquet", "csv", "json")


class Command(BaseCommand):
    help = (
        "Schedule one message per row of a Parquet, CSV or JSON-lines dataset on QUEUE, with "
        "Spark. Ids come from a column or are derived from columns, so a re-run schedules "
        "nothing twice. Rows that cannot be scheduled go to --rejects with their reason."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--input", required=True, help="file or directory to read")
        parser.add_argument("--format", choices=FORMATS, help="default: from the extension")
        parser.add_argument("--queue", required=True, help="a queue of DELAYQUEUE['QUEUES']")
        ids = parser.add_mutually_exclusive_group(required=True)
        ids.add_argument("--id-column", help="column holding the message id")
        ids.add_argument("--id-from", help="columns (a,b) whose SHA-1 is the message id")
        due = parser.add_mutually_exclusive_group()
        due.add_argument("--due-column", help="timestamp (or epoch ms) column: the due time")
        due.add_argument("--delay-column", help="column of seconds from now: the delay")
        parser.add_argument("--payload-columns", help="columns a,b,c of the payload (default: all)")
        parser.add_argument(
            "--rejects", help="where to write rejected rows (default: ./delayqueue-rejects/...)"
        )
        parser.add_argument("--rejects-format", choices=FORMATS, default="json")
        parser.add_argument("--partitions", type=int, help="repartition to N parallel writers")
        parser.add_argument("--chunk-size", type=int, default=500, help="messages per script call")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        add_spark_arguments(parser)
        add_redis_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        queue = options["queue"]
        try:
            max_payload = queue_settings(queue).max_payload_bytes
        except ConfigurationError as e:
            raise CommandError(str(e)) from e
        spark = spark_session(f"schedule_bulk {queue}", options["master"], options["verbosity"])
        from django_delayqueue.spark.bulk import read_input, schedule_dataframe
        from django_delayqueue.spark.transforms import MessageSpec

        spec = MessageSpec(
            id_column=options["id_column"],
            id_from=split_columns(options["id_from"]),
            due_column=options["due_column"],
            delay_column=options["delay_column"],
            payload_columns=split_columns(options["payload_columns"]),
            max_payload_bytes=max_payload,
        )
        rejects = options["rejects"] or default_rejects_path(queue)
        fmt = options["format"] or guess_format(options["input"])
        show = options["verbosity"] > 0 and not options["no_progress"]
        try:
            df = read_input(spark, options["input"], fmt)
            with progress_bar(show) as on_progress:
                summary = schedule_dataframe(
                    df,
                    redis_url(options["redis_url"]),
                    dq_settings.PREFIX,
                    queue,
                    spec,
                    rejects_path=rejects,
                    rejects_format=options["rejects_format"],
                    chunk_size=options["chunk_size"],
                    partitions=options["partitions"],
                    on_progress=on_progress,
                )
        except (DelayQueueError, ValueError) as e:
            raise CommandError(str(e)) from e
        except Exception as e:  # Spark's AnalysisException etc.: a bad path or column
            if type(e).__module__.startswith(("pyspark", "py4j")):
                raise CommandError(f"Spark job failed: {e}") from e
            raise
        self.stdout.write(
            f"queue {queue}: {summary.scheduled} scheduled, {summary.already_present} already "
            f"present, {summary.rejected} rejected (of {summary.total} rows, "
            f"{summary.partitions} partitions) in {summary.seconds:.1f}s"
        )
        for reason, count in sorted(summary.reasons.items(), key=lambda kv: -kv[1]):
            self.stdout.write(f"  {count:>10}  {reason}")
        if summary.rejected:
            self.stdout.write(f"rejected rows written to {rejects}")


def guess_format(path: str) -> str:
    suffix = Path(path).suffix.lower().lstrip(".")
    return {"csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json"}.get(suffix, "parquet")


def default_rejects_path(queue: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return str(Path("delayqueue-rejects") / f"{queue}-{stamp}")


class progress_bar:
    """A tqdm bar over Spark tasks (on stderr); a no-op when not shown or tqdm is missing."""

    def __init__(self, show: bool) -> None:
        self.bar: Any = None
        if show:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=0, unit="task", desc="scheduling", file=sys.stderr)

    def __enter__(self) -> Any:
        return self.update if self.bar is not None else None

    def update(self, done: int, total: int) -> None:
        if total != self.bar.total:
            self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            if exc[0] is None:
                self.bar.n = self.bar.total
            self.bar.close()
