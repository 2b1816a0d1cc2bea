"""Backlog rows: memory per pending message, scheduling and counts() against a big backlog,
and the longest single script call while a consumer promotes a large due backlog."""

from __future__ import annotations

import time
from typing import Any

from django_delayqueue.core import Queue

from .harness import PAYLOAD_100, Bench, Child, Row, at_least, at_most, interleave, rate
from .produce import messages, schedule_calls
from .sizes import Sizes

DAY_MS = 86_400_000
CHUNK = 10_000  # items per schedule_many call while filling


def fill(queue: Queue, count: int, first_due_ms: int, spacing_ms: int = 1) -> float:
    """Schedule ``count`` 100-byte messages due from ``first_due_ms`` on; returns msg/s."""
    start = time.perf_counter_ns()
    for base in range(0, count, CHUNK):
        queue.schedule_many(
            [
                {"payload": PAYLOAD_100, "at": first_due_ms + (base + i) * spacing_ms}
                for i in range(min(CHUNK, count - base))
            ]
        )
    return rate(count, time.perf_counter_ns() - start)


def backlog(bench: Bench, sizes: Sizes) -> list[Row]:
    full = Queue(bench.client, "bench-backlog")
    empty = Queue(bench.client, "bench-empty")
    future = sizes.backlog - sizes.backlog_due

    # 1. Memory: the far-future part alone, so every message counted is pending.
    before = bench.used_memory()
    fill_rate = fill(full, future, full.clock.now_ms() + DAY_MS)
    per_message = (bench.used_memory() - before) / future

    # 2. The part that falls due together, once the rest is written.
    lead_ms = 2000 + int(sizes.backlog_due / fill_rate * 1500)
    due_at = full.clock.now_ms() + lead_ms
    fill(full, sizes.backlog_due, due_at, spacing_ms=0)

    # 3. schedule() and counts() against the full queue and an empty one, interleaved.
    probe = messages(sizes.backlog_probe, seed=4)
    rounds = sizes.rounds
    sched = interleave(
        rounds,
        schedule_calls(full, probe, rounds),
        schedule_calls(empty, probe, rounds),
    )
    empty_counts = Queue(bench.client, "bench-never-used")
    calls = max(100, sizes.backlog_probe // 10)
    counts = interleave(rounds, _counts_calls(full, calls), _counts_calls(empty_counts, calls))
    pending = full.counts()["pending"]

    # 4. A consumer meets the due part: the longest single script call while it promotes.
    while full.clock.now_ms() <= due_at:
        time.sleep(0.01)
    due_now = bench.client.zcount(full.keys.pending, "-inf", due_at)
    with bench.slowlog(threshold_us=500) as slow:
        # Not start_consumer(): it returns once the consumer idles, i.e. after all the work.
        child = Child(["-m", "bench.consumer_child", "--url", bench.url, "--queue", full.name])
        started = time.perf_counter()
        try:
            while bench.client.zcount(full.keys.pending, "-inf", due_at) > 0:
                if time.perf_counter() - started > sizes.timeout:
                    raise RuntimeError("the consumer did not promote the due backlog in time")
                time.sleep(0.01)
            promote_seconds = time.perf_counter() - started  # includes the child's start-up
        finally:
            child.stop(timeout=60)
    longest_ms = slow[0][0] / 1000 if slow else 0.0
    bench.flush()

    label = f"{sizes.backlog:,} pending"
    return [
        Row(
            "memory.per_message",
            f"memory per pending message, 100-byte payload ({future:,} pending)",
            per_message,
            "B",
            target="<= 300 B",
            ok=at_most(per_message, 300),
            extra={"fill_rate_per_s": fill_rate},
        ),
        Row(
            "backlog.schedule",
            f"schedule() with {label}",
            sched.rates[0],
            "msg/s",
            sched.rates[1],
            "schedule() on an empty queue",
            sched.ratio,
            ">= 0.8x empty",
            at_least(sched.ratio, 0.8),
            extra={"pending": pending},
        ),
        Row(
            "backlog.counts",
            f"counts() with {label}",
            1e6 / counts.rates[0],
            "us/call",
            1e6 / counts.rates[1],
            "counts() on an empty queue",
            counts.rates[1] / counts.rates[0],  # time ratio: 1.0 = as fast as empty
            "reported",
        ),
        Row(
            "backlog.promote",
            f"longest script call while promoting {due_now:,} due of {label}",
            longest_ms,
            "ms",
            target="<= 20 ms",
            ok=at_most(longest_ms, 20.0),
            note=f"promoted in {promote_seconds:.1f} s; {len(slow)} calls over 0.5 ms; slowest: "
            + ", ".join(f"{name} {us / 1000:.1f} ms" for us, name in slow[:3]),
            extra={
                "slowest_calls": slow[:20],
                "promote_seconds": promote_seconds,
            },
        ),
    ]


def _counts_calls(queue: Queue, calls: int) -> Any:
    def work(_round: int) -> int:
        for _ in range(calls):
            queue.counts()
        return calls

    return work
