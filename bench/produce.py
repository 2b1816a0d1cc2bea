"""Scheduling rows: one ``schedule()`` call per message, and ``schedule_many`` in batches."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

from django_delayqueue.core import Queue

from .harness import Bench, Row, at_least, interleave
from .raw import Raw
from .sizes import Sizes


def messages(count: int, seed: int, payload: Any = None) -> list[dict[str, Any]]:
    """``count`` messages with random delays from one minute to one hour (a fixed seed)."""
    rng = random.Random(seed)
    return [
        {
            "payload": payload if payload is not None else {"order": i},
            "delay": rng.uniform(60, 3600),
        }
        for i in range(count)
    ]


def schedule_calls(queue: Queue, items: list[dict[str, Any]], rounds: int) -> Callable[[int], int]:
    """A workload: round ``r`` schedules its share of ``items`` one call at a time."""
    share = len(items) // rounds

    def work(r: int) -> int:
        schedule = queue.schedule
        for item in items[r * share : (r + 1) * share]:
            schedule(item["payload"], delay=item["delay"])
        return share

    return work


def schedule_one(bench: Bench, sizes: Sizes) -> list[Row]:
    raw = Raw(bench.client)
    queue = Queue(bench.client, "bench-one")
    items = messages(sizes.schedule_one, seed=1)
    rounds = sizes.schedule_rounds
    share = sizes.schedule_one // rounds
    result = interleave(
        rounds,
        schedule_calls(queue, items, rounds),
        raw.evalsha_one(share),
        raw.zadd_one(share),
        raw.evalsha_bound(share),
    )
    ours, evalsha, zadd, bound = result.rates
    # The same one-line script sent the way schedule() sends its own (core/scripts/fast_path.py):
    # how much of the ratio comes from skipping redis-py's per-command layer.
    lean_ratio = statistics.median(r[0] / r[3] for r in result.rounds)
    bench.flush()
    return [
        Row(
            "schedule.one",
            f"schedule(), one call per message ({sizes.schedule_one:,}, random delays)",
            ours,
            "msg/s",
            evalsha,
            "raw EVALSHA of a one-line ZADD script, one at a time",
            result.ratio,
            ">= 0.9x raw",
            at_least(result.ratio, 0.9),
            note=f"against the one-line script sent through schedule()'s own lean path "
            f"({bound:,.0f}/s): {lean_ratio:.2f}x",
            extra={
                "raw_zadd_per_s": zadd,
                "raw_evalsha_lean_per_s": bound,
                "ratio_to_lean_evalsha": lean_ratio,
                "rounds": result.rounds,
            },
        )
    ]


def schedule_many(bench: Bench, sizes: Sizes) -> list[Row]:
    raw = Raw(bench.client)
    queue = Queue(bench.client, "bench-many")
    batch = sizes.schedule_many_batch
    items = messages(sizes.schedule_many, seed=2)
    share = sizes.schedule_many // sizes.rounds

    def ours(r: int) -> int:
        part = items[r * share : (r + 1) * share]
        for start in range(0, len(part), batch):
            queue.schedule_many(part[start : start + batch])
        return share

    result = interleave(sizes.rounds, ours, raw.zadd_pipelined(share, batch))
    scheduled = queue.counts()["pending"]
    bench.flush()
    return [
        Row(
            "schedule.many",
            f"schedule_many(), {sizes.schedule_many:,} in batches of {batch}",
            result.rates[0],
            "msg/s",
            result.rates[1],
            f"raw pipelined ZADD, {batch} per pipeline",
            result.ratio,
            ">= 0.6x raw",
            at_least(result.ratio, 0.6),
            extra={"pending_after": scheduled, "rounds": result.rounds},
        )
    ]
