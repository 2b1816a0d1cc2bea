"""django_delayqueue.spark.bulk: bulk scheduling through schedule.lua, exactly once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from memory_support import full

pytest.importorskip("pyspark")

import pyarrow as pa
from pyspark.sql import functions as F

from django_delayqueue.core import Queue, RedisOutOfMemory
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.spark import transforms as t
from django_delayqueue.spark.bulk import (
    partition_writer,
    read_input,
    schedule_dataframe,
)
from django_delayqueue.spark.transforms import MessageSpec

NOW = 4_000_000_000_000  # far ahead of the Redis clock: delayed rows stay pending
ROWS = 3000


def orders(spark: Any, n: int = ROWS) -> Any:
    """n orders, due 1..n hours after NOW (all in the future: they stay pending)."""
    return spark.range(1, n + 1, numPartitions=3).select(
        F.format_string("order-%d", "id").alias("ref"),
        F.col("id").alias("order_id"),
        (F.col("id") % 50 * 1.25).alias("amount"),
        (F.col("id") * 3600).alias("delay_s"),
    )


def test_a_bulk_run_schedules_every_row_once_and_a_rerun_schedules_none(
    spark: Any, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    spec = MessageSpec(
        id_column="ref", delay_column="delay_s", payload_columns=("order_id", "amount")
    )
    df = orders(spark)
    first = schedule_dataframe(
        df, redis_server.url, "dq", "bulk", spec, rejects_path=str(tmp_path / "r1"), now_ms=NOW
    )
    assert (first.scheduled, first.already_present, first.rejected) == (ROWS, 0, 0)
    assert first.partitions == 3
    q = Queue(redis_client, "bulk")
    assert q.counts()["pending"] == ROWS

    again = schedule_dataframe(
        df, redis_server.url, "dq", "bulk", spec, rejects_path=str(tmp_path / "r2"), now_ms=NOW
    )
    assert (again.scheduled, again.already_present, again.rejected) == (0, ROWS, 0)
    assert q.counts()["pending"] == ROWS

    # What the job stored is what Queue.schedule would have stored for that row.
    due, scheduled, payload = decode_envelope(redis_client.hget(q.keys.messages, "order-7"))
    assert (due, scheduled, payload) == (
        NOW + 7 * 3600 * 1000,
        NOW,
        {"order_id": 7, "amount": 8.75},
    )
    assert redis_client.zscore(q.keys.pending, "order-7") == due


def test_bulk_rows_with_a_uniqueness_window_are_refused_while_it_is_open(
    spark: Any, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    df = spark.createDataFrame(
        [("sms-1", 86400.0), ("sms-2", 86400.0), ("sms-3", None), ("sms-4", -1.0)],
        "ref string, window double",
    )
    spec = MessageSpec(id_column="ref", payload_columns=("ref",), unique_for_column="window")

    def run(name: str) -> Any:
        path = str(tmp_path / name)
        return schedule_dataframe(
            df, redis_server.url, "dq", "bulk-unique", spec, rejects_path=path, now_ms=NOW
        )

    first = run("r1")
    assert (first.scheduled, first.within_window, first.rejected) == (3, 0, 1)
    assert first.reasons == {t.BAD_UNIQUE_FOR: 1}
    q = Queue(redis_client, "bulk-unique")
    assert q.cancel("sms-1", "sms-2", "sms-3") == 3  # a cancel keeps the windows
    again = run("r2")
    # sms-1 and sms-2 meet their windows; sms-3 had none and is scheduled again.
    assert (again.scheduled, again.within_window, again.already_present) == (1, 2, 0)
    assert again.total == 4
    assert redis_client.hkeys(q.keys.messages) == [b"sms-3"]
    assert redis_client.zcard(q.keys.unique) == 2


def test_bad_rows_land_in_rejects_with_their_reason_and_none_is_lost(
    spark: Any, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = [
        ("ok-1", "2030-01-01 00:00:00", "short"),
        ("ok-2", "2030-01-01 00:00:01", "short"),
        ("no-due", None, "short"),
        ("big", "2030-01-01 00:00:02", "x" * 500),
        ("bad\tid", "2030-01-01 00:00:03", "short"),
        (None, "2030-01-01 00:00:04", "short"),
    ]
    df = spark.createDataFrame(data, "key string, due string, note string")
    spec = MessageSpec(id_column="key", due_column="due", max_payload_bytes=200)
    rejects = tmp_path / "rejects"
    summary = schedule_dataframe(
        df, redis_server.url, "dq", "bulk", spec, rejects_path=str(rejects), now_ms=NOW
    )
    assert (summary.scheduled, summary.rejected, summary.total) == (2, 4, len(data))
    assert summary.reasons == {
        t.MISSING_DUE: 1,
        t.TOO_LARGE + "200": 1,
        t.BAD_ID_CHARS: 1,
        t.MISSING_ID: 1,
    }
    written = spark.read.json(str(rejects)).collect()
    by_reason = {r[t.REASON]: r for r in written}
    assert len(written) == 4
    assert by_reason[t.MISSING_DUE]["key"] == "no-due"  # the input row comes with its reason
    assert by_reason[t.TOO_LARGE + "200"]["note"] == "x" * 500
    assert by_reason[t.BAD_ID_CHARS]["key"] == "bad\tid"
    assert Queue(redis_client, "bulk").counts()["pending"] == 2


def test_readers_take_csv_and_json_lines(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("key,delay,amount\na,5,1.5\nb,6,2.5\n")
    (tmp_path / "in.json").write_text('{"key": "a", "delay": 5}\n{"key": "b", "delay": 6}\n')
    csv_rows = read_input(spark, str(tmp_path / "in.csv"), "csv").orderBy("key").collect()
    assert [(r["key"], r["delay"], r["amount"]) for r in csv_rows] == [("a", 5, 1.5), ("b", 6, 2.5)]
    json_rows = read_input(spark, str(tmp_path / "in.json"), "json").orderBy("key").collect()
    assert [(r["key"], r["delay"]) for r in json_rows] == [("a", 5), ("b", 6)]


def test_the_executor_function_refuses_ids_the_core_refuses_instead_of_dropping_them(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            t.ID: ["good", "bad\u2028id"],  # a line separator: refused by validate_id
            t.DUE: [NOW + 1000, NOW + 1000],
            t.PAYLOAD: ['{"n":1}', '{"n":2}'],
            t.REASON: pa.array([None, None], pa.string()),  # both passed the transforms
        }
    )
    write = partition_writer(redis_server.url, "dq", "bulk", NOW, chunk_size=10)
    (result,) = list(write(iter([batch])))
    rows = result.to_pylist()
    assert rows[0]["scheduled"] == 1 and rows[0][t.REASON] is None
    assert rows[1][t.ID] == "bad\u2028id" and rows[1][t.REASON].startswith("bad id")
    assert json.loads(rows[1][t.PAYLOAD]) == {"n": 2}
    assert redis_client.hkeys(Queue(redis_client, "bulk").keys.messages) == [b"good"]


def test_the_executor_function_fails_its_task_when_redis_is_out_of_memory(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    # As when Redis is down: the task fails and Spark runs it again (the ids make that safe),
    # rather than counting rows Redis did not store as done.
    batch = pa.RecordBatch.from_pydict(
        {
            t.ID: ["a", "b"],
            t.DUE: [NOW + 1000, NOW + 2000],
            t.PAYLOAD: ['{"n":1}', '{"n":2}'],
            t.REASON: pa.array([None, None], pa.string()),
        }
    )
    write = partition_writer(redis_server.url, "dq", "bulk-full", NOW, chunk_size=10)
    with full(redis_client), pytest.raises(RedisOutOfMemory, match="2 message"):
        list(write(iter([batch])))
    assert redis_client.hkeys(Queue(redis_client, "bulk-full").keys.messages) == []
    (result,) = list(write(iter([batch])))  # run again once there is room
    assert result.to_pylist()[0]["scheduled"] == 2


def test_the_executor_function_counts_the_rows_the_transforms_rejected(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            t.ID: ["a", None, "c", None],
            t.DUE: [NOW + 1000, None, None, None],
            t.PAYLOAD: ['{"n":1}', None, None, None],
            t.REASON: [None, "missing id", "missing delay", "missing id"],
        }
    )
    write = partition_writer(redis_server.url, "dq", "bulk-counted", NOW, chunk_size=10)
    (result,) = list(write(iter([batch])))
    rows = result.to_pylist()
    assert rows[0]["scheduled"] == 1
    counted = {r[t.REASON]: r["rejected"] for r in rows[1:]}
    assert counted == {"missing id": 2, "missing delay": 1}  # counted, never scheduled
    assert redis_client.hkeys(Queue(redis_client, "bulk-counted").keys.messages) == [b"a"]
