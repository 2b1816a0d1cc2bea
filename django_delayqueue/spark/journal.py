"""The delivery journal: read from the queues' Redis streams, exported as partitioned Parquet.

Each queue's capped stream (``QueueKeys.journal``) holds one entry per consumer batch (and one
per ``cancel`` call) with fields ``n`` (row count) and ``o`` (a JSON list of rows laid out as
:data:`~django_delayqueue.core.journal.JOURNAL_FIELDS`; rows of earlier versions lack the
last, ``limit_wait_ms``, read as 0). An export is incremental: it
appends the entries newer than the newest one already exported for each queue, so exporting often
keeps the history that the stream's cap would otherwise drop.

What was exported where is kept in Redis (``QueueKeys.exported``: destination -> newest entry id
written there), not read back from the destination, which the driver may not see (storage of
the executors) and which may be rewritten by hand. A cursor moves only after Spark wrote its
rows, so a failed run exports them again next time rather than never.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from django_delayqueue.core.client import RedisClient, connect
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.journal import JOURNAL_MIN_FIELDS
from django_delayqueue.core.keys import QueueKeys

logger = logging.getLogger(__name__)

ARROW_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("entry_id", pa.string()),
        ("entry_ms", pa.int64()),
        ("entry_seq", pa.int64()),
        ("id", pa.string()),
        ("scheduled_ms", pa.int64()),
        ("due_ms", pa.int64()),
        ("delivered_ms", pa.int64()),
        ("finished_ms", pa.int64()),
        ("attempt", pa.int32()),
        ("outcome", pa.string()),
        ("error", pa.string()),
        # A flow limit's hold before the claim (ms; 0 in rows written before it was kept). A
        # journal exported before this column reads it as null: reports take that as 0.
        ("limit_wait_ms", pa.int64()),
        ("day", pa.string()),  # UTC day of the outcome, the second partition level
    ]
)
COLUMNS = tuple(ARROW_SCHEMA.names)
_SPARK_TYPES = {pa.string(): "string", pa.int64(): "long", pa.int32(): "int"}
SPARK_SCHEMA = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in ARROW_SCHEMA)
ROWS_PER_WRITE = 200_000  # rows held on the driver before they are written
PAGE = 1000  # stream entries per XRANGE


def discover_queues(client: RedisClient, prefix: str) -> list[str]:
    """Names of the queues that have a journal stream under ``prefix`` (a sharded queue once)."""
    return sorted({keys.queue for keys in discover_streams(client, prefix)})


def discover_streams(client: RedisClient, prefix: str) -> list[QueueKeys]:
    """The keys of every queue, or shard of a queue, with a journal stream under ``prefix``."""
    marker = f"{{{prefix}:"
    found = set()
    for key in client.scan_iter(match=f"{{{prefix}:*}}:journal", count=1000):
        text = to_str(key)
        if text.startswith(marker) and text.endswith("}:journal"):
            name, _, shard = text[len(marker) : -len("}:journal")].partition("#")
            try:
                found.add(QueueKeys(prefix, name, int(shard) if shard else None))
            except (ValueError, ConfigurationError):  # not a key this app wrote
                continue
    return sorted(found, key=lambda k: (k.queue, -1 if k.shard is None else k.shard))


def _streams_of(client: RedisClient, prefix: str, names: Iterable[str]) -> list[QueueKeys]:
    """The journal streams of queues ``names``: each one's own, and its shards' if it has any."""
    wanted = set(names)
    found = [k for k in discover_streams(client, prefix) if k.queue in wanted]
    missing = wanted - {k.queue for k in found}
    return found + [QueueKeys(prefix, name) for name in sorted(missing)]


def read_entries(
    client: RedisClient, stream: str, after: str | None = None, page: int = PAGE
) -> Iterator[tuple[str, dict[Any, Any]]]:  # bytes keys, or str from a decoding client
    """Entries of ``stream`` newer than entry id ``after`` (all when ``None``), oldest first."""
    start = f"({after}" if after else "-"
    while True:
        # redis-py types the reply as optional; XRANGE always answers a list.
        entries: list[tuple[Any, dict[Any, Any]]] = client.xrange(
            stream, min=start, max="+", count=page
        )  # type: ignore[assignment]
        for entry_id, fields in entries:
            yield to_str(entry_id), fields
        if len(entries) < page:
            return
        start = f"({to_str(entries[-1][0])}"


def journal_rows(
    client: RedisClient,
    prefix: str,
    queue: str,
    after: str | None = None,
    shard: int | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Rows (in :data:`COLUMNS` order) of ``queue``'s journal (or its shard ``shard``'s) after
    entry id ``after``; the rows of a shard are the logical queue's."""
    stream = QueueKeys(prefix, queue, shard).journal
    for entry_id, fields in read_entries(client, stream, after):
        ms, seq = (int(x) for x in entry_id.split("-"))
        try:
            rows = json.loads(fields.get(b"o") or fields.get("o") or "[]")
        except ValueError:
            logger.warning("journal %s: entry %s is not JSON; skipped", stream, entry_id)
            continue
        for row in rows:
            if not isinstance(row, list) or len(row) < JOURNAL_MIN_FIELDS:
                logger.warning("journal %s: malformed row in entry %s; skipped", stream, entry_id)
                continue
            message_id, scheduled, due, delivered, finished, attempt, outcome, error = row[:8]
            # Rows of earlier versions, and cancels, have no limit wait: none held them.
            waited = _int(row[8]) if len(row) > JOURNAL_MIN_FIELDS else 0
            when = finished if finished is not None else delivered if delivered is not None else ms
            day = time.strftime("%Y-%m-%d", time.gmtime(when / 1000))
            times = [_int(scheduled), _int(due), _int(delivered), _int(finished)]
            yield (queue, entry_id, ms, seq, str(message_id), *times, _int(attempt),
                   str(outcome), str(error or ""), waited or 0, day)  # fmt: skip


def rows_to_arrow(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    """A pyarrow Table of journal rows (in :data:`COLUMNS` order)."""
    columns: list[tuple[Any, ...]] = (
        list(zip(*rows, strict=True)) if rows else [() for _ in COLUMNS]
    )
    return pa.Table.from_arrays(
        [pa.array(list(col), type=f.type) for col, f in zip(columns, ARROW_SCHEMA, strict=True)],
        schema=ARROW_SCHEMA,
    )


def exported_cursors(
    client: RedisClient, streams: Sequence[QueueKeys], out: str
) -> dict[QueueKeys, str]:
    """The newest entry id already exported to ``out``, per stream (missing: none yet)."""
    pipe = client.pipeline(transaction=False)
    for keys in streams:
        pipe.hget(keys.exported, _destination(out))
    return {k: to_str(v) for k, v in zip(streams, pipe.execute(), strict=True) if v is not None}


def _destination(out: str) -> str:
    return out.rstrip("/") or out


def _save_cursors(client: RedisClient, out: str, last: dict[QueueKeys, str]) -> None:
    pipe = client.pipeline(transaction=False)
    for keys, entry_id in last.items():
        pipe.hset(keys.exported, _destination(out), entry_id)
    pipe.execute()


def export_journal(
    spark: SparkSession,
    redis_url: str,
    prefix: str,
    out: str,
    queues: Iterable[str] | None = None,
    *,
    full: bool = False,
    redis_cluster: bool = False,
) -> dict[str, int]:
    """Append new journal rows to Parquet at ``out``, partitioned by queue and day.

    ``queues`` defaults to every queue with a journal. ``full`` rewrites ``out`` from what the
    streams hold now instead of appending. Returns the rows written per queue.
    """
    client = connect(redis_url, cluster=redis_cluster, socket_connect_timeout=10, socket_timeout=60)
    try:
        names = sorted(set(queues) if queues is not None else discover_queues(client, prefix))
        # A sharded queue has a stream per shard; its rows all go under the queue's name.
        streams = _streams_of(client, prefix, names)
        cursors = {} if full else exported_cursors(client, streams, out)
        mode = "overwrite" if full else "append"
        written: dict[str, int] = dict.fromkeys(names, 0)
        buffer: list[tuple[Any, ...]] = []
        last: dict[QueueKeys, str] = {}  # newest entry id per stream in the buffer
        for keys in streams:
            rows = journal_rows(client, prefix, keys.queue, cursors.get(keys), keys.shard)
            for row in rows:
                buffer.append(row)
                last[keys] = row[1]
                written[keys.queue] += 1
                if len(buffer) >= ROWS_PER_WRITE:
                    _write(spark, buffer, out, mode)
                    _save_cursors(client, out, last)
                    buffer, mode, last = [], "append", {}
        if buffer or mode == "overwrite" or not _journal_exists(spark, out):
            # Even with no rows, leave a journal at ``out``: the report that reads it next
            # then says it is empty rather than that there is no journal.
            _write(spark, buffer, out, mode)
        _save_cursors(client, out, last)
    finally:
        client.close()
    logger.info("journal export to %s: %s", out, written)
    return written


def read_journal(spark: SparkSession, path: str) -> DataFrame:
    """The exported journal (queue and day come back from the partition directories).

    The schema is given so that partition values keep their types (a queue named ``2024``
    stays a string, days stay ``YYYY-MM-DD`` strings).
    """
    return spark.read.schema(SPARK_SCHEMA).parquet(path)


def _journal_exists(spark: SparkSession, path: str) -> bool:
    try:
        read_journal(spark, path)
    except AnalysisException:  # no such path
        return False
    return True


def _write(spark: SparkSession, rows: list[tuple[Any, ...]], out: str, mode: str) -> None:
    frame = spark.createDataFrame(rows_to_arrow(rows))
    frame.write.mode(mode).partitionBy("queue", "day").parquet(out)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
