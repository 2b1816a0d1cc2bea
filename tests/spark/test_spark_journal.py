"""The delivery journal: cancels are journalled; export to Parquet is incremental."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis
from core_consumer_support import burst as run_burst

from django_delayqueue.core import Message, Queue, QueueKeys, QueueSettings, Reject
from django_delayqueue.embedded import RedisServerProcess

T0 = 1_700_000_000_000  # the manual_clock fixture's start


def test_cancel_journals_one_cancel_row_per_cancelled_message(
    make_queue: Any, redis_client: redis.Redis
) -> None:
    q = make_queue("jq")
    q.schedule({"n": 1}, id="a", delay=5)
    q.schedule({"n": 2}, id="b", delay=9)
    redis_client.hset(q.keys.messages, "b", "not json")  # a corrupt envelope is still journalled
    assert q.cancel("a", "b", "unknown") == 2
    ((_, fields),) = redis_client.xrange(q.keys.journal)
    assert fields[b"n"] == b"2"
    assert json.loads(fields[b"o"]) == [
        ["a", T0, T0 + 5000, None, T0, 0, "cancel", ""],
        ["b", None, None, None, T0, 0, "cancel", ""],
    ]
    assert q.cancel("a") == 0
    assert redis_client.xlen(q.keys.journal) == 1  # nothing cancelled, nothing journalled


def test_cancel_without_a_journal_when_maxlen_is_zero(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "jq", journal_maxlen=0)
    q.schedule({}, id="a", delay=5)
    assert q.cancel("a") == 1
    assert not redis_client.exists(q.keys.journal)


def handler(message: Message) -> None:
    if message.payload == "fail":
        raise ValueError("boom")
    if message.payload == "reject":
        raise Reject("no")


def burst(queue: Queue) -> int:
    return run_burst([queue], handler, idle_seconds=0.2).delivered


def test_export_writes_every_outcome_once_partitioned_by_queue_and_day(
    spark: Any, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    from django_delayqueue.spark.journal import discover_queues, export_journal, read_journal

    slow_retry = QueueSettings(backoff_base=3600, backoff_max=3600)  # m3 does not come back
    q = Queue(redis_client, "jq", prefix="dq", settings=slow_retry)
    for i, payload in enumerate(["ok", "ok", "ok", "fail", "reject"]):
        q.schedule(payload, id=f"m{i}")
    q.schedule("later", id="later", delay=3600)
    assert burst(q) == 5
    assert q.cancel("later") == 1
    assert discover_queues(redis_client, "dq") == ["jq"]

    out = str(tmp_path / "journal")
    assert export_journal(spark, redis_server.url, "dq", out) == {"jq": 6}
    rows = {r["id"]: r for r in read_journal(spark, out).collect()}
    assert {k: r["outcome"] for k, r in rows.items()} == {
        "m0": "ack", "m1": "ack", "m2": "ack", "m3": "retry", "m4": "garbage", "later": "cancel",
    }  # fmt: skip
    assert (rows["m3"]["error"], rows["m4"]["error"], rows["m0"]["error"]) == (
        "ValueError",
        "Reject",
        "",
    )
    assert all(rows[k]["delivered_ms"] >= rows[k]["due_ms"] for k in ("m0", "m3", "m4"))
    assert rows["later"]["delivered_ms"] is None and rows["later"]["attempt"] == 0
    assert all(r["queue"] == "jq" and len(r["day"]) == 10 for r in rows.values())
    assert list(Path(out, "queue=jq").glob("day=*"))

    assert export_journal(spark, redis_server.url, "dq", out) == {"jq": 0}  # nothing new
    q.schedule("ok", id="m5")
    assert burst(q) == 1
    assert export_journal(spark, redis_server.url, "dq", out) == {"jq": 1}
    assert read_journal(spark, out).count() == 7
    assert export_journal(spark, redis_server.url, "dq", out, full=True) == {"jq": 7}
    assert sorted(r["id"] for r in read_journal(spark, out).collect()) == sorted([*rows, "m5"])


def test_what_was_exported_where_is_kept_in_redis_not_read_from_the_output(
    spark: Any, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    import shutil

    from django_delayqueue.spark.journal import export_journal

    q = Queue(redis_client, "cursor-q", prefix="dq")
    for i in range(3):
        q.schedule("ok", id=f"c{i}")
    assert burst(q) == 3
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    assert export_journal(spark, redis_server.url, "dq", first) == {"cursor-q": 3}
    # The driver need not see the output: gone from here, nothing is exported twice there.
    shutil.rmtree(first)
    assert export_journal(spark, redis_server.url, "dq", first) == {"cursor-q": 0}
    # Another destination has its own cursor: everything still in the stream goes there.
    assert export_journal(spark, redis_server.url, "dq", second) == {"cursor-q": 3}
    assert redis_client.hget(QueueKeys("dq", "cursor-q").exported, first) is not None
