"""``manage.py export_journal``: the delivery journal as Parquet, by queue and day (Spark)."""

from __future__ import annotations

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.conf.settings import dq_settings, queue_names
from django_delayqueue.core.client import connect
from django_delayqueue.management.commands._spark import (
    add_redis_argument,
    add_spark_arguments,
    on_cluster,
    redis_url,
    require_shared_path,
    spark_session,
    split_columns,
)


class Command(BaseCommand):
    help = (
        "Append the journal entries not yet exported (every queue's capped Redis stream) to "
        "Parquet under --out, partitioned by queue and day. --full rewrites --out instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--out", required=True, help="directory or URI of the Parquet dataset (hdfs://, s3a://)"
        )
        parser.add_argument(
            "--queues", help="queues a,b (default: configured ones and any with a journal)"
        )
        parser.add_argument("--full", action="store_true", help="rewrite instead of append")
        add_spark_arguments(parser)
        add_redis_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        url = redis_url(options["redis_url"], on_cluster(options["master"]))
        require_shared_path(options["master"], "--out", options["out"])
        spark = spark_session("export_journal", options["master"], options["verbosity"])
        from django_delayqueue.spark.journal import discover_queues, export_journal

        prefix = dq_settings.PREFIX
        names = split_columns(options["queues"])
        try:
            if not names:
                client = connect(url, cluster=bool(dq_settings.CLUSTER), socket_connect_timeout=10)
                try:
                    names = tuple(sorted({*queue_names(), *discover_queues(client, prefix)}))
                finally:
                    client.close()
            written = export_journal(
                spark,
                url,
                prefix,
                options["out"],
                names,
                full=options["full"],
                redis_cluster=bool(dq_settings.CLUSTER),
            )
        except redis.RedisError as e:
            raise CommandError(f"could not read the journal from Redis: {e}") from e
        for queue, rows in written.items():
            self.stdout.write(f"{queue}: {rows} journal row(s) exported")
        self.stdout.write(f"journal written to {options['out']} ({sum(written.values())} rows)")
