"""Bulk scheduling: every row of a DataFrame becomes a message, through ``schedule.lua``.

Each Spark task opens one Redis client and sends its rows in pipelined chunks with
:meth:`Queue.schedule_prepared`, the same Lua script every other producer uses. Scheduling is
idempotent on the (deterministic) message id, so a retried task or a re-run of the whole job
creates nothing twice: what was already there is counted as ``already_present``. Rows with a
uniqueness window (``MessageSpec.unique_for_column``) go through ``schedule_unique.lua`` instead;
those their id's open window refused are counted as ``within_window``. A row's flow key
(``MessageSpec.key_column``) goes in its envelope, as ``schedule(..., key=)`` puts it there; on a
sharded queue a keyed row's id must route to its key's shard (the row is rejected otherwise, as
``schedule`` refuses such an id: a made-up id would not be deterministic).

Counting uses Spark actions only, never files read back: every prepared row goes to the
writers, which schedule the good ones and count the rejected ones by reason, and each task
yields its counts (plus any row the core refused at the last moment) for the driver to sum. So
every row is accounted for wherever the rejects are written (a path the driver cannot see
included), in one pass over the input; the rejected rows are then written by Spark in a second
pass only when there are some.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from django_delayqueue.core.client import connect
from django_delayqueue.core.clock import RedisClock
from django_delayqueue.core.envelope import encode_envelope, validate_id, validate_key
from django_delayqueue.core.errors import ConfigurationError, PayloadError, RedisOutOfMemory
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.logical_queue import LogicalQueue
from django_delayqueue.core.queue import DEFAULT_CHUNK, Queue
from django_delayqueue.core.results import BulkResult, Prepared
from django_delayqueue.core.sharding import ShardedQueue, key_shard, shard_index
from django_delayqueue.spark.progress import ProgressCallback, watch_progress
from django_delayqueue.spark.transforms import (
    DUE,
    ID,
    KEY,
    KEY_SHARD,
    PAYLOAD,
    REASON,
    UNIQUE,
    MessageSpec,
    prepare,
    split,
)

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "csv", "json")
PIPELINE_CHUNKS = 8  # schedule.lua calls per pipeline: one round trip per 8 x chunk_size rows
_RESULT_FIELDS = [
    ("scheduled", pa.int64()),
    ("already_present", pa.int64()),
    ("within_window", pa.int64()),
    ("rejected", pa.int64()),
    (ID, pa.string()),
    (DUE, pa.int64()),
    (PAYLOAD, pa.string()),
    (REASON, pa.string()),
]
_RESULT_ARROW = pa.schema(_RESULT_FIELDS)
_RESULT_SCHEMA = ", ".join(
    f"{name} {'long' if t == pa.int64() else 'string'}" for name, t in _RESULT_FIELDS
)
# Executors fail fast on a dead Redis (the task fails; re-running the job is safe).
CLIENT_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 10, "socket_timeout": 60}


@dataclass(frozen=True)
class BulkSummary:
    """What a bulk run did. ``scheduled + already_present + within_window + rejected`` is
    every input row."""

    scheduled: int
    already_present: int
    rejected: int
    reasons: dict[str, int] = field(default_factory=dict)  # rejected rows by reason
    partitions: int = 0
    seconds: float = 0.0
    rejects_path: str | None = None
    within_window: int = 0  # valid rows their id's open uniqueness window kept out

    @property
    def total(self) -> int:
        return self.scheduled + self.already_present + self.within_window + self.rejected


def read_input(
    spark: SparkSession, path: str, fmt: str = "parquet", options: Mapping[str, str] | None = None
) -> DataFrame:
    """Read Parquet, CSV (with a header; types inferred) or JSON lines."""
    if fmt not in FORMATS:
        raise ConfigurationError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.format(fmt).load(path)


def schedule_dataframe(
    df: DataFrame,
    redis_url: str,
    prefix: str,
    queue: str,
    spec: MessageSpec,
    *,
    rejects_path: str | None = None,
    rejects_format: str = "json",
    chunk_size: int = DEFAULT_CHUNK,
    now_ms: int | None = None,
    partitions: int | None = None,
    on_progress: ProgressCallback | None = None,
    redis_cluster: bool = False,
    shards: int = 1,
) -> BulkSummary:
    """Schedule every good row of ``df`` on ``queue``; write the others to ``rejects_path``.

    ``now_ms`` (default: the Redis server's clock) is the base of delays and the envelopes'
    scheduled time. ``partitions`` repartitions first (more parallel Redis writers).
    ``rejects_path`` is a path or URI the executors write to (``hdfs://``, ``s3a://``...).
    ``redis_cluster``: ``redis_url`` names a node of a Redis Cluster (each executor's client
    then sends each queue's scripts to that queue's node). ``shards``: the queue's shards
    (its ``"shards"`` setting): each row goes to its id's shard.
    """
    QueueKeys(prefix, queue)  # validates both names before any work
    if rejects_format not in FORMATS:
        raise ConfigurationError(f"unknown rejects format {rejects_format!r}")
    started = time.monotonic()
    if now_ms is None:
        client = connect(redis_url, cluster=redis_cluster, **CLIENT_OPTIONS)
        try:
            # The producers' reading: never behind the server, so no due time is early.
            now_ms = math.ceil(RedisClock(client).now_upper_ms())
        finally:
            client.close()
    if partitions:
        df = df.repartition(partitions)
    prepared = prepare(df, spec, now_ms)
    with watch_progress(df.sparkSession.sparkContext, on_progress, f"schedule on {queue}"):
        writer = partition_writer(
            redis_url, prefix, queue, now_ms, chunk_size, redis_cluster, shards
        )
        rows = (
            prepared.select(ID, DUE, PAYLOAD, UNIQUE, KEY, REASON)
            .mapInArrow(writer, _RESULT_SCHEMA)
            .collect()
        )
        reasons: dict[str, int] = {}
        for r in rows:
            if r[REASON] is not None and r[ID] is None:  # a task's count of one reason
                reasons[r[REASON]] = reasons.get(r[REASON], 0) + r["rejected"]
        if reasons:
            _write_rejects(split(prepared)[1], rejects_path, rejects_format)
    scheduled = sum(r["scheduled"] for r in rows)
    present = sum(r["already_present"] for r in rows)
    within_window = sum(r["within_window"] for r in rows)
    late = [r for r in rows if r[REASON] is not None and r[ID] is not None]
    if late:
        reasons = _add_late_rejects(df.sparkSession, late, reasons, rejects_path, rejects_format)
    summary = BulkSummary(
        scheduled=scheduled,
        already_present=present,
        rejected=sum(reasons.values()),
        reasons=reasons,
        partitions=sum(1 for r in rows if r[REASON] is None),
        seconds=time.monotonic() - started,
        rejects_path=rejects_path,
        within_window=within_window,
    )
    logger.info(
        "queue %s: %d scheduled, %d already present, %d in their window, %d rejected in %.1fs",
        queue,
        summary.scheduled,
        summary.already_present,
        summary.within_window,
        summary.rejected,
        summary.seconds,
    )
    return summary


def _write_rejects(rejects: DataFrame, path: str | None, fmt: str) -> None:
    """Write the rejected rows, with every input column and their reason (already counted)."""
    if path is None:
        logger.warning("rejected rows are counted but not written (no rejects path)")
    else:
        rejects.write.mode("overwrite").format(fmt).option("header", "true").save(path)


def _add_late_rejects(
    spark: SparkSession,
    late: Sequence[Any],
    reasons: dict[str, int],
    path: str | None,
    fmt: str,
) -> dict[str, int]:
    """Rows the core refused on an executor (rare: ids Spark's checks let through)."""
    merged = dict(reasons)
    for row in late:
        merged[row[REASON]] = merged.get(row[REASON], 0) + 1
    if path is not None:
        rows = [(r[ID], r[REASON]) for r in late]
        frame = spark.createDataFrame(rows, f"{ID} string, {REASON} string")
        frame.write.mode("append").format(fmt).option("header", "true").save(path)
    logger.warning("%d row(s) refused by the core at scheduling time", len(late))
    return merged


def partition_writer(
    redis_url: str,
    prefix: str,
    queue: str,
    now_ms: int,
    chunk_size: int = DEFAULT_CHUNK,
    redis_cluster: bool = False,
    shards: int = 1,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs: schedule its rows, yield its counts (a picklable closure)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = connect(redis_url, cluster=redis_cluster, **CLIENT_OPTIONS)
        rejected: dict[str, int] = {}
        try:
            q: LogicalQueue = Queue(client, queue, prefix=prefix)
            if shards > 1:  # each row to its id's shard, as dq.schedule would send it
                q = ShardedQueue(
                    [Queue(client, queue, prefix=prefix, shard=i) for i in range(shards)]
                )
            good = _good_rows(batches, rejected)
            done, refused = _send(q, good, now_ms, chunk_size)
        finally:
            client.close()
        rows = [_result(done.scheduled, done.already_present, within_window=done.within_window)]
        rows += [_result(0, 0, n, reason=reason) for reason, n in rejected.items()]
        rows += [_result(0, 0, 1, *row) for row in refused]
        yield pa.RecordBatch.from_pylist(rows, schema=_RESULT_ARROW)

    return write


def _good_rows(
    batches: Iterator[pa.RecordBatch], rejected: dict[str, int]
) -> Iterator[pa.RecordBatch]:
    """The batches without their rejected rows, which are counted by reason in ``rejected``."""
    for batch in batches:
        reasons = batch.column(REASON)
        if reasons.null_count == len(batch):
            yield batch
            continue
        for item in pc.value_counts(reasons.drop_null()).to_pylist():
            rejected[item["values"]] = rejected.get(item["values"], 0) + item["counts"]
        yield batch.filter(pc.is_null(reasons))


def _send(
    q: LogicalQueue, batches: Iterator[pa.RecordBatch], now_ms: int, chunk_size: int
) -> tuple[BulkResult, list[tuple[str, int, str, str]]]:
    """Schedule the rows of ``batches``: what became of them, and the rows the core refused."""
    done = BulkResult()
    refused: list[tuple[str, int, str, str]] = []
    prepared: list[Prepared] = []
    windows: list[int] = []
    flush_at = chunk_size * PIPELINE_CHUNKS
    for batch in batches:
        ids = batch.column(ID).to_pylist()
        dues = batch.column(DUE).to_pylist()
        payloads = batch.column(PAYLOAD).to_pylist()
        uniques = _optional(batch, UNIQUE, 0)
        keys = _optional(batch, KEY, None)
        rows = zip(ids, dues, payloads, uniques, keys, strict=True)
        for message_id, due, payload, window, key in rows:
            try:
                envelope = _envelope(q, message_id, due, payload, key, now_ms)
            except PayloadError as e:
                refused.append((message_id, due, payload, str(e)))
                continue
            prepared.append(Prepared(message_id, due, envelope))
            windows.append(window or 0)
            if len(prepared) >= flush_at:
                done.merge(_stored(q, prepared, windows, chunk_size))
                prepared, windows = [], []
    if prepared:
        done.merge(_stored(q, prepared, windows, chunk_size))
    return done, refused


def _optional(batch: pa.RecordBatch, name: str, default: Any) -> list[Any]:
    """A column of ``batch`` as a list, or ``default`` for each row when it has none."""
    if batch.schema.get_field_index(name) >= 0:
        return batch.column(name).to_pylist()
    return [default] * len(batch)


def _envelope(
    q: LogicalQueue, message_id: str, due: int, payload: str, key: str | None, now_ms: int
) -> str:
    """The row's envelope; PayloadError (its reason) for what the core refuses that Spark's
    checks let through, or a keyed row whose id cannot live on its key's shard."""
    try:
        validate_id(message_id)
    except PayloadError as e:
        raise PayloadError(f"bad id: {e}") from e
    if key is not None:
        try:
            validate_key(key)
        except PayloadError as e:
            raise PayloadError(f"bad key: {e}") from e
        shards = len(q.shards) if isinstance(q, ShardedQueue) else 1
        if shards > 1 and shard_index(message_id, shards) != key_shard(key, shards):
            raise PayloadError(KEY_SHARD)
    return encode_envelope(payload, due, now_ms, key=key)


def _stored(
    q: LogicalQueue, prepared: list[Prepared], windows: list[int], chunk_size: int
) -> BulkResult:
    """``prepared`` scheduled (with their uniqueness windows, ms, if any has one);
    RedisOutOfMemory if Redis had no room for some: the task fails, as it does when Redis is
    down, and Spark runs it again (the rows' ids make that safe; a row stored before the
    failure finds its own window, and counts as within_window the second time)."""
    unique_ms = windows if any(windows) else None  # none: the lean schedule.lua path
    result = q.schedule_prepared(prepared, chunk_size=chunk_size, unique_ms=unique_ms)
    if result.not_scheduled:
        first = result.not_scheduled[0]
        raise RedisOutOfMemory(f"{len(result.not_scheduled)} message(s) not stored: {first.reason}")
    return result


def _result(
    scheduled: int,
    present: int,
    rejected: int = 0,
    message_id: str | None = None,
    due: int | None = None,
    payload: str | None = None,
    reason: str | None = None,
    *,
    within_window: int = 0,
) -> dict[str, Any]:
    return {
        "scheduled": scheduled,
        "already_present": present,
        "within_window": within_window,
        "rejected": rejected,
        ID: message_id,
        DUE: due,
        PAYLOAD: payload,
        REASON: reason,
    }
