"""Bulk scheduling with Spark vs a raw redis-py pipelined ZADD baseline, in the same run.

    python -m bench.bulk_schedule --rows 1000000
    python -m bench.bulk_schedule --rows 20000 --json /tmp/bulk.json   # a quick look

Starts its own redis-server, writes a demo orders dataset (Parquet, untimed), warms Spark up
on a small run, then times ``schedule_dataframe`` over every row (read + transforms +
schedule.lua through pipelines). The baseline stores the same number of ids with ``ZADD``
on one connection, 1000 per pipeline, measured before and after the Spark run; the ratio is
taken against the faster of the two (the conservative figure). Target: >= 0.5x.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess

from .raw import Raw

TARGET = 0.5
BATCH = 1000
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bulk_schedule.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.bulk_schedule", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--partitions", type=int, default=None, help="dataset files (default: cores)")
    p.add_argument("--chunk-size", type=int, default=500, help="messages per schedule.lua call")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p.parse_args(argv)


def baseline(client: redis.Redis, rows: int) -> float:
    """Raw pipelined ZADD of ``rows`` ids: messages per second."""
    raw = Raw(client)
    work = raw.zadd_pipelined(rows, BATCH)
    started = time.perf_counter()
    work(0)
    elapsed = time.perf_counter() - started
    raw.clear()
    return rows / elapsed


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from django_delayqueue.spark.bulk import read_input, schedule_dataframe
    from django_delayqueue.spark.demo import demo_orders, write_dataset
    from django_delayqueue.spark.session import get_spark
    from django_delayqueue.spark.transforms import MessageSpec

    spec = MessageSpec(
        id_column="order_ref",
        due_column="close_at",
        payload_columns=("order_id", "store_id", "amount"),
    )
    with RedisServerProcess() as server, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(server.url)
        spark = get_spark("bench-bulk-schedule", args.master)
        partitions = args.partitions or spark.sparkContext.defaultParallelism
        now = int(time.time() * 1000)
        log(f"writing {args.rows} demo orders in {partitions} file(s) ...")
        write_dataset(
            demo_orders(spark, args.rows, 1000, partitions=partitions, now_ms=now), f"{tmp}/orders"
        )
        write_dataset(
            demo_orders(spark, 20_000, 100, partitions=partitions, now_ms=now), f"{tmp}/warm"
        )

        log("warming up (20000 rows) ...")
        schedule_dataframe(read_input(spark, f"{tmp}/warm"), server.url, "bench", "warm", spec)
        client.flushall()

        log("baseline: raw pipelined ZADD ...")
        before = baseline(client, args.rows)

        log("spark bulk job ...")
        started = time.perf_counter()
        summary = schedule_dataframe(
            read_input(spark, f"{tmp}/orders"),
            server.url,
            "bench",
            "orders",
            spec,
            rejects_path=f"{tmp}/rejects",
            chunk_size=args.chunk_size,
        )
        elapsed = time.perf_counter() - started
        counts = Queue(client, "orders", prefix="bench").counts()
        stored = counts["pending"] + counts["ready"]
        if summary.scheduled != args.rows or stored != args.rows:
            log(f"FAILED: scheduled {summary.scheduled}, stored {stored} of {args.rows}")
            return 1

        log("re-run (every id already present) ...")
        rerun_started = time.perf_counter()
        rerun = schedule_dataframe(
            read_input(spark, f"{tmp}/orders"), server.url, "bench", "orders", spec
        )
        rerun_elapsed = time.perf_counter() - rerun_started
        log("baseline again ...")
        after = baseline(client, args.rows)
        memory = client.info("memory")["used_memory"]
        spark.stop()

    rate = args.rows / elapsed
    best = max(before, after)
    result: dict[str, Any] = {
        "rows": args.rows,
        "master": args.master,
        "partitions": partitions,
        "cpus": os.cpu_count(),
        "spark_seconds": round(elapsed, 2),
        "spark_msgs_per_s": round(rate),
        "rerun_seconds": round(rerun_elapsed, 2),
        "rerun_already_present": rerun.already_present,
        "baseline_zadd_msgs_per_s": {"before": round(before), "after": round(after)},
        "ratio": round(rate / best, 3),
        "target": TARGET,
        "ok": rate / best >= TARGET,
        "redis_used_memory_mb": round(memory / 2**20, 1),
    }
    verdict = "ok" if result["ok"] else "MISSED"
    print(f"rows                            {args.rows:>12,}")
    print(f"spark bulk schedule (msgs/s)    {rate:>12,.0f}  ({elapsed:.1f} s, {partitions} parts)")
    print(f"raw pipelined ZADD (msgs/s)     {best:>12,.0f}  ({before:,.0f} / {after:,.0f})")
    print(f"ratio                           {rate / best:>12.2f}x (target {TARGET}x: {verdict})")
    print(f"re-run, all already present     {rerun_elapsed:>12.1f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    log(f"JSON: {args.json}")
    return 0


def log(text: str) -> None:
    print(f"[bulk_schedule] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
