"""``manage.py demo_dataset``: write demo orders and stores for the bulk job (Spark)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_delayqueue.management.commands._spark import (
    add_spark_arguments,
    require_shared_path,
    spark_session,
)

FORMATS = ("parquet", "csv", "json")


class Command(BaseCommand):
    help = (
        "Generate a realistic demo dataset (orders and stores of the demo shop) with Spark, "
        "e.g. a million orders to try schedule_bulk on: OUT/orders and OUT/stores."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--orders", type=int, default=100_000, help="default 100000")
        parser.add_argument("--stores", type=int, default=1_000, help="default 1000")
        parser.add_argument(
            "--out", required=True, help="directory or URI to write (hdfs://, s3a://, file://)"
        )
        parser.add_argument("--format", choices=FORMATS, default="parquet")
        parser.add_argument("--partitions", type=int, help="files per dataset (default: cores)")
        parser.add_argument("--seed", type=int, default=42)
        add_spark_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        require_shared_path(options["master"], "--out", options["out"])
        spark = spark_session("demo_dataset", options["master"], options["verbosity"])
        from django_delayqueue.spark.demo import demo_orders, demo_stores, write_dataset
        from django_delayqueue.spark.storage import join

        out, fmt, seed = options["out"], options["format"], options["seed"]
        orders_uri, stores_uri = join(out, "orders"), join(out, "stores")
        orders = demo_orders(
            spark,
            options["orders"],
            options["stores"],
            seed=seed,
            partitions=options["partitions"],
        )
        write_dataset(orders, orders_uri, fmt)
        write_dataset(demo_stores(spark, options["stores"], seed=seed), stores_uri, fmt)
        self.stdout.write(
            f"wrote {options['orders']} orders to {orders_uri} and {options['stores']} "
            f"stores to {stores_uri} ({fmt})"
        )
        self.stdout.write(
            f"try: manage.py schedule_bulk --input {orders_uri} --format {fmt} "
            "--queue order-close --id-column order_ref --due-column close_at "
            "--payload-columns order_id,store_id,amount"
        )
