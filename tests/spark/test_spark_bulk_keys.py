"""Flow keys on the Spark bulk path: ``schedule_bulk --key-column`` / ``MessageSpec.key_column``
puts each row's key in its envelope (as ``schedule(..., key=)``), a bad key is a reject with its
reason, and on a sharded queue a keyed row whose id cannot live on its key's shard is refused."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command

pytest.importorskip("pyspark")

import pyarrow as pa

from django_delayqueue.core import Queue
from django_delayqueue.core.envelope import decode_envelope_parts
from django_delayqueue.core.sharding import key_shard, shard_index
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.spark import transforms as t
from django_delayqueue.spark.bulk import partition_writer

QUEUE = "order-close"  # configured in tests/settings.py
NOW = 4_000_000_000_000  # far ahead of the Redis clock: delayed rows stay pending


def flow_keys(client: redis.Redis, q: Queue) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(q.keys.flow_keys).items()}


def test_schedule_bulk_key_column_keys_each_row_and_rejects_an_empty_key(
    spark: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    rows = [
        ("sms-1", "+33612345678", 3600.0),
        ("sms-2", "+33612345678", 3601.0),
        ("sms-3", "store,42", 3602.0),
        ("sms-4", None, 3603.0),  # no key
        ("sms-5", "", 3604.0),  # refused, as key="" is
        ("sms-6", "x" * 201, 3605.0),
    ]
    data = str(tmp_path / "sms.parquet")
    spark.createDataFrame(rows, "ref string, phone string, delay_s double").write.parquet(data)
    rejects = str(tmp_path / "rejects")
    args = ["schedule_bulk", "--input", data, "--queue", QUEUE, "--id-column", "ref"]
    args += ["--delay-column", "delay_s", "--key-column", "phone", "--rejects", rejects]
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    assert "4 scheduled, 0 already present, 2 rejected (of 6 rows" in out.getvalue()
    q = Queue(redis_client, QUEUE)
    assert flow_keys(redis_client, q) == {
        "sms-1": "+33612345678",
        "sms-2": "+33612345678",
        "sms-3": "store,42",
    }
    envelope = redis_client.hget(q.keys.messages, "sms-3")
    assert decode_envelope_parts(envelope).key == "store,42"
    # The payload is the row's columns, the key column among them, as without --key-column.
    assert decode_envelope_parts(envelope).payload["phone"] == "store,42"
    assert decode_envelope_parts(redis_client.hget(q.keys.messages, "sms-4")).key is None
    reasons = {r["ref"]: r["dq_reason"] for r in spark.read.json(rejects).collect()}
    assert reasons == {"sms-5": t.EMPTY_KEY, "sms-6": t.KEY_TOO_LONG}


def test_a_numeric_key_column_is_taken_as_its_text(
    spark: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = str(tmp_path / "stores.parquet")
    spark.createDataFrame([("a", 42), ("b", 7)], "ref string, store long").write.parquet(data)
    args = ["schedule_bulk", "--input", data, "--queue", QUEUE, "--id-column", "ref"]
    call_command(*args, "--key-column", "store", stdout=StringIO(), stderr=StringIO())
    assert flow_keys(redis_client, Queue(redis_client, QUEUE)) == {"a": "42", "b": "7"}


def test_the_job_file_carries_the_key_column(tmp_path: Path) -> None:
    job_file = tmp_path / "job.json"
    call_command(
        "schedule_bulk", "--input", "s3a://bucket/sms", "--queue", QUEUE, "--id-column", "ref",
        "--key-column", "phone", "--rejects", "s3a://bucket/rejects",
        "--redis-url", "redis://redis.internal/0", "--write-job", str(job_file), stdout=StringIO(),
    )  # fmt: skip
    assert json.loads(job_file.read_text())["spec"]["key_column"] == "phone"


def test_on_a_sharded_queue_a_keyed_row_must_route_to_its_keys_shard(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    home = key_shard("store-1", 4)
    fits = [f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) == home][:2]
    away = next(f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) != home)
    plain = next(f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) != home)
    batch = pa.RecordBatch.from_pydict(
        {
            t.ID: [*fits, away, plain],
            t.DUE: [NOW + 1000] * 4,
            t.PAYLOAD: ['{"n":1}', '{"n":2}', '{"n":3}', '{"n":4}'],
            t.UNIQUE: [0, 0, 0, 0],
            t.KEY: ["store-1", "store-1", "store-1", None],
            t.REASON: pa.array([None] * 4, pa.string()),
        }
    )
    write = partition_writer(redis_server.url, "dq", "sharded-sms", NOW, chunk_size=10, shards=4)
    (result,) = list(write(iter([batch])))
    rows = result.to_pylist()
    assert rows[0]["scheduled"] == 3  # both keyed rows that fit, and the row without a key
    assert (rows[1][t.ID], rows[1][t.REASON]) == (away, t.KEY_SHARD)
    shard = Queue(redis_client, "sharded-sms", shard=home)
    assert flow_keys(redis_client, shard) == dict.fromkeys(fits, "store-1")
    plain_shard = Queue(redis_client, "sharded-sms", shard=shard_index(plain, 4))
    assert redis_client.hexists(plain_shard.keys.messages, plain)
