"""``manage.py schedule_bulk``: schedule every row of a dataset as a message (Spark job)."""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.conf.queues import queue_settings
from django_delayqueue.conf.settings import dq_settings, queue_shards
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError
from django_delayqueue.management.commands._spark import (
    add_redis_argument,
    add_spark_arguments,
    on_cluster,
    redis_url,
    require_shared_path,
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
        parser.add_argument(
            "--input", required=True, help="file, directory or URI to read (hdfs://, s3a://)"
        )
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
            "--unique-for-column",
            help="column of seconds: each row's uniqueness window (as unique_for=; null: none)",
        )
        parser.add_argument(
            "--key-column",
            help="column of each row's flow key (as key=; null: none), which the queue's "
            "key_concurrency and key_rate_limit count by",
        )
        parser.add_argument(
            "--rejects",
            help="path or URI for rejected rows (default on local[*]: ./delayqueue-rejects/...; "
            "required on a cluster)",
        )
        parser.add_argument("--rejects-format", choices=FORMATS, default="json")
        parser.add_argument("--partitions", type=int, help="repartition to N parallel writers")
        parser.add_argument("--chunk-size", type=int, default=500, help="messages per script call")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument(
            "--write-job",
            metavar="FILE",
            help="write the job as JSON for spark-submit (spark/submit.py) instead of running it",
        )
        add_spark_arguments(parser)
        add_redis_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        queue, master = options["queue"], options["master"]
        try:
            max_payload = queue_settings(queue).max_payload_bytes
            shards = queue_shards(queue)
        except ConfigurationError as e:
            raise CommandError(str(e)) from e
        rejects = options["rejects"]
        if rejects is None:
            if on_cluster(master) or options["write_job"]:
                # A relative path is resolved by each executor on its own host: the rows
                # would be counted, then scattered over the workers' disks.
                raise CommandError("give --rejects: a path or URI every executor can write to")
            rejects = default_rejects_path(queue)
        require_shared_path(master, "--input", options["input"])
        require_shared_path(master, "--rejects", rejects)
        from django_delayqueue.spark.jobs import ScheduleJob, guess_format

        job = ScheduleJob(
            input=options["input"],
            format=options["format"] or guess_format(options["input"]),
            queue=queue,
            prefix=dq_settings.PREFIX,
            # A job written for spark-submit runs on a cluster.
            redis_url=redis_url(
                options["redis_url"], on_cluster(master) or bool(options["write_job"])
            ),
            spec={
                "id_column": options["id_column"],
                "id_from": split_columns(options["id_from"]),
                "due_column": options["due_column"],
                "delay_column": options["delay_column"],
                "payload_columns": split_columns(options["payload_columns"]),
                "unique_for_column": options["unique_for_column"],
                "key_column": options["key_column"],
                "max_payload_bytes": max_payload,
            },
            rejects=rejects,
            redis_cluster=bool(dq_settings.CLUSTER),
            shards=shards,
            rejects_format=options["rejects_format"],
            chunk_size=options["chunk_size"],
            partitions=options["partitions"],
        )
        if options["write_job"]:
            with open(options["write_job"], "w") as f:
                f.write(job.to_json())
            self.stdout.write(f"job written to {options['write_job']} (run it with spark-submit)")
            return
        spark = spark_session(f"schedule_bulk {queue}", master, options["verbosity"])
        from django_delayqueue.spark.jobs import run_schedule_job, summary_lines

        show = options["verbosity"] > 0 and not options["no_progress"]
        try:
            with progress_bar(show) as on_progress:
                summary = run_schedule_job(spark, job, on_progress)
        except (DelayQueueError, ValueError) as e:
            raise CommandError(str(e)) from e
        except Exception as e:  # Spark's AnalysisException etc.: a bad path or column
            if type(e).__module__.startswith(("pyspark", "py4j")):
                raise CommandError(f"Spark job failed: {e}") from e
            raise
        for line in summary_lines(queue, summary, rejects):
            self.stdout.write(line)


def default_rejects_path(queue: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"delayqueue-rejects/{queue}-{stamp}"


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
