"""Delivery rows: throughput, lateness and idle cost of one consumer process."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from django_delayqueue.core import Queue

from .harness import Bench, Child, Row, at_least, at_most, percentile, timed, wait_until
from .raw import Raw
from .sizes import Sizes

CHILD = ["-m", "bench.consumer_child"]


def start_consumer(bench: Bench, queue: Queue, *extra: str) -> Child:
    """A consumer child on ``queue``, returned once it listens on the wake channel."""
    child = Child([*CHILD, "--url", bench.url, "--queue", queue.name, *extra])
    channel = queue.keys.wake_channel

    def listening() -> bool:
        if child.proc.poll() is not None:
            raise RuntimeError(f"consumer child exited early:\n{child.proc.stderr.read()}")
        return bench.client.pubsub_numsub(channel)[0][1] > 0

    if not wait_until(listening, timeout=30):
        child.kill()
        raise RuntimeError("consumer child did not subscribe within 30 s")
    return child


def report_of(out: str) -> dict[str, Any]:
    return json.loads(out.strip().splitlines()[-1])


def raw_evalsha_rate(bench: Bench, seconds: float = 1.0) -> float:
    """One-at-a-time EVALSHA rate right now (a short burst: the machine is noisy)."""
    raw = Raw(bench.client)
    count = max(200, int(seconds * 10_000))
    rate = timed(lambda: raw.evalsha_one(count)(0))
    raw.clear()
    return rate


def schedule_due_at_once(queue: Queue, count: int, payload: Any) -> int:
    """Schedule ``count`` messages all due at one moment after the last is written; wait for it.

    They are written as pending (not straight to ready) so that the consumer also promotes.
    """
    lead_ms = 2000 + count // 20  # schedule_many does well over 20k/s: all are pending in time
    due = queue.clock.now_ms() + lead_ms
    for start in range(0, count, 10_000):
        queue.schedule_many(
            [{"payload": payload, "at": due} for _ in range(min(10_000, count - start))]
        )
    while queue.clock.now_ms() <= due:
        time.sleep(0.005)
    return due


def throughput(bench: Bench, sizes: Sizes) -> list[Row]:
    rows = []
    for concurrency in sizes.concurrencies:
        queue = Queue(bench.client, f"bench-deliver-{concurrency}")
        schedule_due_at_once(queue, sizes.delivery, {"order": 1})
        before = raw_evalsha_rate(bench)
        child = Child(
            [
                *CHILD,
                "--url",
                bench.url,
                "--queue",
                queue.name,
                "--concurrency",
                str(concurrency),
                "--count",
                str(sizes.delivery),
            ]
        )
        report = report_of(child.wait(sizes.timeout)[0])
        after = raw_evalsha_rate(bench)
        left = queue.counts()
        baseline = (before + after) / 2
        ours = sizes.delivery / (report["elapsed_ns"] / 1e9)
        ratio = ours / baseline
        rows.append(
            Row(
                f"deliver.c{concurrency}",
                f"delivery, {sizes.delivery:,} due at once, concurrency {concurrency}, no-op",
                ours,
                "msg/s",
                baseline,
                "raw EVALSHA one at a time (before/after)",
                ratio,
                ">= 2.0x raw",
                at_least(ratio, 2.0) if not any(left.values()) else False,
                note="" if not any(left.values()) else f"left in Redis: {left}",
                extra={
                    "delivered": report["delivered"],
                    "left": left,
                    # The consumer process's CPU per message: steadier than the rate when
                    # other processes share the host.
                    "cpu_us_per_message": report["cpu_ns"] / 1000 / max(1, report["delivered"]),
                },
            )
        )
        bench.flush()
    return rows


def lateness(bench: Bench, sizes: Sizes) -> list[Row]:
    """Messages due uniformly over a window; half written ahead, half while it runs.

    The ones written while it runs have short delays (10-500 ms), so most of them are due
    before anything already pending: they test the producer's wake-up of a sleeping consumer.
    A message this producer only got into Redis after its due time (its process was not
    scheduled in time on this shared host) says nothing about the consumer: those are counted
    and reported apart, and left out of the percentiles.
    """
    spec = f"{sizes.lateness:,} messages over {sizes.lateness_seconds:g} s"
    return _lateness_rows(bench, sizes, "lateness", spec, slow_lanes=0)


SLOW_HANDLER_MS = 1000
SLOW_CONCURRENCY = 8


def lateness_beside_slow(bench: Bench, sizes: Sizes) -> list[Row]:
    """The lateness row again, while slow handlers (1 s each) keep half the threads busy.

    Half of the consumer's 8 threads run a 1-second handler at all times (a slow API, an SMS
    gateway); the fast messages must still start on time on the other half. Only the fast
    messages are measured, with the plain lateness row's targets.
    """
    lanes = SLOW_CONCURRENCY // 2
    spec = (
        f"{sizes.lateness:,} fast messages over {sizes.lateness_seconds:g} s beside "
        f"{lanes} slow {SLOW_HANDLER_MS} ms handlers, concurrency {SLOW_CONCURRENCY}"
    )
    return _lateness_rows(bench, sizes, "lateness_slow", spec, slow_lanes=lanes)


def _lateness_rows(bench: Bench, sizes: Sizes, key: str, spec: str, slow_lanes: int) -> list[Row]:
    queue = Queue(bench.client, f"bench-{key}")
    rng = random.Random(3)
    count, window_ms = sizes.lateness, int(sizes.lateness_seconds * 1000)
    start = queue.clock.now_ms() + 500
    # Back to back in each lane: `slow_lanes` slow handlers running through the whole window.
    slow = [
        {"payload": {"slow": 1}, "at": start + n * SLOW_HANDLER_MS}
        for _ in range(slow_lanes)
        for n in range(window_ms // SLOW_HANDLER_MS + 1)
    ]
    extra = ["--lateness", "--count", str(count + len(slow))]
    if slow_lanes:
        extra += ["--concurrency", str(SLOW_CONCURRENCY), "--slow-ms", str(SLOW_HANDLER_MS)]
    child = start_consumer(bench, queue, *extra)
    try:
        dues = sorted(start + rng.randrange(window_ms) for _ in range(count))
        ahead, live = dues[0::2], dues[1::2]
        queue.schedule_many(slow + [{"payload": {"n": i}, "at": d} for i, d in enumerate(ahead)])
        plan = sorted((due - rng.randint(10, 500), due) for due in live)
        written_late: set[str] = set()
        for write_at, due in plan:
            pause = (write_at - queue.clock.now_ms()) / 1000
            if pause > 0:
                time.sleep(pause)
            result = queue.schedule({"n": due}, at=due)
            if queue.clock.now_ms() >= due:
                written_late.add(result.id)
        report = report_of(child.wait(sizes.timeout + sizes.lateness_seconds + 2)[0])
    finally:
        child.kill()
    pairs = zip(report["lateness_ids"], report["lateness_ms"], strict=True)
    late = [ms for message_id, ms in pairs if message_id not in written_late]
    p50, p99, worst = percentile(late, 50), percentile(late, 99), max(late)
    early = sum(1 for x in report["lateness_ms"] if x < 0)
    bench.flush()
    common = {
        "samples": len(late),
        "early": early,
        "min_ms": min(late),
        "written_after_due": len(written_late),
        "slow_messages": len(slow),
    }
    return [
        Row(f"{key}.p50", f"{key} p50 ({spec})", p50, "ms", target="<= 1 ms",
            ok=at_most(p50, 1.0) and early == 0, extra=common,
            note=f"{early} started early; {len(written_late)} the producer wrote only after "
            "their due time, left out"),
        Row(f"{key}.p99", f"{key} p99 ({spec})", p99, "ms", target="<= 5 ms",
            ok=at_most(p99, 5.0) and early == 0),
        Row(f"{key}.max", f"{key} max ({spec})", worst, "ms", target="<= 20 ms",
            ok=at_most(worst, 20.0) and early == 0),
    ]  # fmt: skip


def idle(bench: Bench, sizes: Sizes) -> list[Row]:
    """Commands/s one idle consumer costs Redis (calls made inside scripts included)."""
    queue = Queue(bench.client, "bench-idle")
    child = start_consumer(bench, queue)
    try:
        time.sleep(0.5)  # past the first step and the first maintenance round
        before = bench.command_calls()
        time.sleep(sizes.idle_seconds)
        after = bench.command_calls()
    finally:
        child.stop()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta["info"] = delta.get("info", 0) - 1  # our own INFO between the two snapshots
    delta = {k: v for k, v in delta.items() if v > 0}
    per_s = sum(delta.values()) / sizes.idle_seconds
    scripts_per_s = delta.get("evalsha", 0) / sizes.idle_seconds
    bench.flush()
    return [
        Row(
            "idle.commands",
            f"idle consumer, {sizes.idle_seconds:g} s",
            per_s,
            "cmd/s",
            target="<= 5 cmd/s",
            ok=at_most(per_s, 5.0),
            note=f"{scripts_per_s:.1f} script calls/s (a safety poll every idle_seconds, a reap "
            "every maintenance_seconds); the rest are the reads inside them and heartbeats",
            extra={"commands": delta},
        )
    ]
