"""``spark-submit`` entry point: the Spark jobs with no Django project on the driver.

    python -m django_delayqueue.spark.package /tmp/django_delayqueue.zip
    python manage.py schedule_bulk --input hdfs://nn/shop/orders --queue order-close \\
        --id-column order_ref --due-column close_at --rejects hdfs://nn/shop/rejects \\
        --redis-url redis://redis.internal:6379/0 --write-job job.json
    spark-submit --master spark://spark-master:7077 --py-files /tmp/django_delayqueue.zip \\
        "$(python -c 'import django_delayqueue.spark.submit as s; print(s.__file__)')" \\
        schedule --job job.json

``schedule --job FILE`` runs a job written by ``manage.py schedule_bulk --write-job``;
``export-journal`` and ``report`` take their settings as arguments. Each prints its result
as one JSON line on stdout. The master, deploy mode and resources are spark-submit's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from pyspark.sql import SparkSession

from django_delayqueue.spark.jobs import ScheduleJob, run_schedule_job


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="submit.py", description=__doc__.splitlines()[0])
    jobs = p.add_subparsers(dest="command", required=True)
    schedule = jobs.add_parser("schedule", help="schedule_bulk from a --write-job file")
    schedule.add_argument("--job", required=True, help="the JSON file schedule_bulk wrote")
    export = jobs.add_parser("export-journal", help="append new journal rows as Parquet")
    export.add_argument("--redis-url", required=True)
    export.add_argument("--prefix", default="dq", help="DELAYQUEUE['PREFIX'] (default dq)")
    export.add_argument("--out", required=True, help="directory or URI of the Parquet dataset")
    export.add_argument("--queues", help="queues a,b (default: every queue with a journal)")
    export.add_argument("--full", action="store_true", help="rewrite instead of append")
    report = jobs.add_parser("report", help="queue_report from an exported journal")
    report.add_argument("--journal", required=True)
    report.add_argument("--out", required=True)
    report.add_argument("--top-errors", type=int, default=5)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # spark-submit set the master and the rest; the package comes with --py-files.
    spark = SparkSession.builder.appName(f"django-delayqueue {args.command}").getOrCreate()
    try:
        if args.command == "schedule":
            job = ScheduleJob.load(args.job)
            summary = run_schedule_job(spark, job)
            result: dict[str, object] = {"queue": job.queue, **asdict(summary)}
        elif args.command == "export-journal":
            from django_delayqueue.spark.journal import export_journal

            queues = [q for q in (args.queues or "").split(",") if q] or None
            written = export_journal(
                spark, args.redis_url, args.prefix, args.out, queues, full=args.full
            )
            result = {"out": args.out, "rows": written}
        else:
            from django_delayqueue.spark.journal import read_journal
            from django_delayqueue.spark.output import write_report
            from django_delayqueue.spark.report import compute_report

            journal = read_journal(spark, args.journal)
            written_report = write_report(compute_report(journal, args.top_errors), args.out)
            result = {"out": written_report.out, "summary": written_report.summary}
    finally:
        spark.stop()
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
