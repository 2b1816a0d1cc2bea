"""``python -m bench.cluster_shards``: one logical queue with 1 and with 3 shards on a local
three-master Redis Cluster, and what one master can take.

Producer processes schedule messages one ``schedule()`` call each, first into a queue of one
shard (every message on one master), then into a queue of three (spread over the masters), in
the same run. Beside the rates, the masters' own ``INFO commandstats`` tell how many
microseconds of a master's single thread one schedule costs: a master's capacity is 1e6 over
that, whatever the clients (on this 2-core machine the Python producers, not Redis, are the
limit, so the end-to-end rates say little about a real cluster). The README's arithmetic for
a larger deployment starts from that per-master figure.

    python -m bench.cluster_shards [--count N] [--producers P] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import redis

from django_delayqueue.embedded import CLUSTER_SLOTS, RedisServerProcess, local_cluster

from .harness import Child, Row
from .report import table, write_json

SLOTS = CLUSTER_SLOTS
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "cluster-shards-latest.json"
TARGET_RATE = 1_000_000  # scheduled messages per second, the deployment the README sizes
HEADROOM = 0.5  # plan masters at half their measured capacity


def spread_name(shards: int) -> str:
    """A queue name whose shards' hash tags land on as many masters as possible (a name with
    one shard is on one master whatever it is)."""
    from redis.crc import key_slot

    def master(tag: str) -> int:
        slot = key_slot(tag.encode())
        return next(i for i, (first, last) in enumerate(SLOTS) if first <= slot <= last)

    for i in range(1000):
        name = f"orders-{shards}-{i}"
        tags = [f"bench:{name}#{n}" if shards > 1 else f"bench:{name}" for n in range(shards)]
        if len({master(t) for t in tags}) == min(shards, len(SLOTS)):
            return name
    raise RuntimeError("no queue name spreads its shards over every master")


def _evalsha(nodes: list[RedisServerProcess]) -> list[tuple[int, int]]:
    """(calls, microseconds) of EVALSHA on each master since its last CONFIG RESETSTAT."""
    out = []
    for node in nodes:
        stats = redis.Redis(port=node.port).info("commandstats").get("cmdstat_evalsha", {})
        out.append((int(stats.get("calls", 0)), int(stats.get("usec", 0))))
    return out


def run(count: int, producers: int) -> list[Row]:
    rows: list[Row] = []
    rates: dict[int, float] = {}
    with local_cluster() as nodes:
        for shards in (1, 3):
            for node in nodes:
                redis.Redis(port=node.port).config_resetstat()
            per_producer = count // producers
            children = [
                Child(
                    [
                        "-m",
                        "bench.cluster_producer",
                        nodes[0].url,
                        "bench",
                        spread_name(shards),
                        str(shards),
                        str(per_producer),
                        str(p * per_producer),
                    ]
                )
                for p in range(producers)
            ]
            elapsed = max(
                json.loads(c.wait(600)[0].strip().splitlines()[-1])["elapsed_ns"] for c in children
            )
            rates[shards] = per_producer * producers / (elapsed / 1e9)
            calls = _evalsha(nodes)
            used = sum(1 for c, _ in calls if c > producers + 1)  # more than the warm-ups
            total_calls = sum(c for c, _ in calls)
            total_us = sum(u for _, u in calls)
            us_per_call = total_us / total_calls if total_calls else None
            rows.append(
                Row(
                    f"cluster.schedule.shards{shards}",
                    f"one queue of {shards} shard(s), {producers} producer processes, "
                    f"{per_producer * producers:,} schedule() calls",
                    rates[shards],
                    "msg/s",
                    baseline=None if shards == 1 else rates[1],
                    baseline_what="" if shards == 1 else "the same queue with 1 shard",
                    ratio=None if shards == 1 else rates[shards] / rates[1],
                    target="reported",
                    note=f"masters used: {used}; Redis time per schedule: {us_per_call:.1f} us"
                    if us_per_call
                    else "",
                    extra={"calls_per_master": [c for c, _ in calls], "us_per_call": us_per_call},
                )
            )
    per_call = [r.extra["us_per_call"] for r in rows if r.extra.get("us_per_call")]
    if per_call:
        us = max(per_call)
        capacity = 1e6 / us
        masters = math.ceil(TARGET_RATE / (capacity * HEADROOM))
        rows.append(
            Row(
                "cluster.master_capacity",
                "schedules one master's thread can run (1e6 / Redis us per schedule)",
                capacity,
                "msg/s",
                target="reported",
                note=f"for {TARGET_RATE:,} msg/s at {HEADROOM:.0%} load: {masters} masters, "
                f"a queue of at least {masters} shards",
                extra={"masters_for_target": masters, "us_per_schedule": us},
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_shards", description=__doc__)
    p.add_argument("--count", type=int, default=30_000, help="schedule() calls per shard count")
    p.add_argument("--producers", type=int, default=2, help="producer processes")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)
    rows = run(args.count, args.producers)
    print(table(rows))
    write_json(args.json, rows, {"count": args.count, "producers": args.producers})
    print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
