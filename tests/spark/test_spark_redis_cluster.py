"""Spark bulk scheduling onto a Redis Cluster: each executor's client sends each queue's script
calls to that queue's own master (``schedule_dataframe(..., redis_cluster=True)``, which
``manage.py schedule_bulk`` passes when ``DELAYQUEUE["CLUSTER"]`` is set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import cluster_support
from cluster_support import spread_queues
from pyspark.sql import functions as F
from redis.cluster import RedisCluster

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.spark.bulk import schedule_dataframe
from django_delayqueue.spark.transforms import MessageSpec

pytestmark = pytest.mark.slow

cluster = cluster_support.cluster  # the fixture: three masters started for this module
NOW = 4_000_000_000_000
ROWS = 600


def test_a_bulk_run_lands_on_each_queue_s_own_master(
    spark: Any, cluster: list[RedisServerProcess], tmp_path: Path
) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    names = spread_queues(client, prefix="sparkc")
    df = spark.range(1, ROWS + 1, numPartitions=3).select(
        F.format_string("order-%d", "id").alias("ref"),
        F.col("id").alias("order_id"),
        (F.col("id") * 60).alias("delay_s"),
    )
    spec = MessageSpec(id_column="ref", delay_column="delay_s", payload_columns=("order_id",))
    for name in names:
        summary = schedule_dataframe(
            df,
            cluster[1].url,  # any node
            "sparkc",
            name,
            spec,
            rejects_path=str(tmp_path / name),
            now_ms=NOW,
            redis_cluster=True,
        )
        assert (summary.scheduled, summary.rejected) == (ROWS, 0)
    for name in names:
        q = Queue(client, name, prefix="sparkc")
        assert q.counts()["pending"] == ROWS
    masters = {
        client.get_node_from_key(Queue(client, n, prefix="sparkc").keys.pending).port for n in names
    }
    assert len(masters) == 3
    client.close()


def test_a_bulk_run_onto_a_sharded_queue_and_its_journal_stay_one_logical_queue(
    spark: Any, cluster: list[RedisServerProcess], tmp_path: Path
) -> None:
    """Rows go to their id's shard (a rerun finds every id where it left it); the shards'
    journals export as the logical queue's rows."""
    from django_delayqueue.core.consumer import Consumer
    from django_delayqueue.core.sharding import ShardedQueue
    from django_delayqueue.spark.journal import discover_queues, export_journal, read_journal

    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    df = spark.range(1, 301, numPartitions=3).select(
        F.format_string("order-%d", "id").alias("ref"), F.col("id").alias("order_id")
    )
    spec = MessageSpec(id_column="ref", payload_columns=("order_id",))  # due at once
    for attempt in range(2):
        summary = schedule_dataframe(
            df,
            cluster[0].url,
            "shardb",
            "orders",
            spec,
            rejects_path=str(tmp_path / f"rejects-{attempt}"),
            redis_cluster=True,
            shards=3,
        )
        expected = (0, 300) if attempt else (300, 0)
        assert (summary.scheduled, summary.already_present) == expected
    shards = [Queue(client, "orders", prefix="shardb", shard=i) for i in range(3)]
    sharded = ShardedQueue(shards)
    assert sharded.counts()["ready"] == 300 and all(q.counts()["ready"] for q in shards)
    Consumer(shards, lambda message: None, burst=True, name="journal-writer").run()
    assert sharded.counts()["ready"] == 0
    assert discover_queues(client, "shardb") == ["orders"]
    out = str(tmp_path / "journal")
    written = export_journal(spark, cluster[0].url, "shardb", out, redis_cluster=True)
    assert written == {"orders": 300}
    journal = read_journal(spark, out)
    assert {row["queue"] for row in journal.select("queue").distinct().collect()} == {"orders"}
    assert journal.count() == 300
    # Incremental: nothing new, nothing written again.
    again = export_journal(spark, cluster[0].url, "shardb", out, redis_cluster=True)
    assert again == {"orders": 0}
    client.close()
