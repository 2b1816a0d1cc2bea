"""``manage.py queue_report``: figures and charts from an exported journal (Spark)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.management.commands._spark import (
    add_spark_arguments,
    require_shared_path,
    spark_session,
)


class Command(BaseCommand):
    help = (
        "Compute per queue and per hour: outcomes, lateness p50/p95/p99/max (less the time a "
        "flow limit held a message, shown apart as limit wait p50/p99/max), attempts, "
        "dead-letter rate, top errors and throughput from a journal written by export_journal. "
        "Writes Parquet, CSV, summary.json and PNG charts to --out and prints a summary table."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--journal", required=True, help="directory or URI written by export_journal"
        )
        parser.add_argument(
            "--out",
            help="report directory or URI (hdfs://, s3a://); default DELAYQUEUE['REPORT_DIR'], "
            "whose charts the admin's queue pages show",
        )
        parser.add_argument("--top-errors", type=int, default=5, help="error classes per hour")
        add_spark_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        options["out"] = options["out"] or dq_settings.REPORT_DIR
        if not options["out"]:
            raise CommandError("give --out DIR (or set DELAYQUEUE['REPORT_DIR'])")
        require_shared_path(options["master"], "--out", options["out"])
        spark = spark_session("queue_report", options["master"], options["verbosity"])
        from pyspark.errors import AnalysisException

        from django_delayqueue.spark.journal import read_journal
        from django_delayqueue.spark.output import format_table, write_report
        from django_delayqueue.spark.report import compute_report

        try:
            journal = read_journal(spark, options["journal"])
            result = write_report(compute_report(journal, options["top_errors"]), options["out"])
        except AnalysisException as e:
            raise CommandError(f"cannot read the journal at {options['journal']}: {e}") from e
        if not result.summary:
            self.stdout.write("the journal is empty: nothing to report")
        else:
            self.stdout.write(format_table(result.summary))
        self.stdout.write(f"report written to {result.out} ({len(result.files)} files)")
