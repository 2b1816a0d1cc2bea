"""Progress (issue 28): what it costs the hot path of a queue whose handlers never report, and
what reporting costs a queue whose handlers do.

    python -m bench --only progress [--quick]

- ``progress.ack_us.*``: Redis time per ack (``INFO commandstats``, microseconds) of ack.lua
  as it is now (it deletes the acked messages' progress: one HDEL per chunk) against ack.lua of
  the base (``git show $BENCH_BASE_REF:…``, default the last commit before progress),
  interleaved rounds on the same in-flight messages. Acks of 1 and of 100 messages.
- ``progress.deliver``: delivery (messages due at once, one consumer process, concurrency 8,
  handlers that report nothing) by this checkout against the base checkout (``git archive`` of
  ``$BENCH_BASE_REF`` run as the consumer child): interleaved rounds. ``progress.deliver_cpu``:
  the consumer process's CPU time per message in the same runs (steadier than wall time on a
  shared host, where a round's rate varies by a quarter).
- ``progress.deliver_reporting``: the same delivery by this checkout with handlers that call
  ``message.progress()`` ten times each, against handlers that do not: what reporting costs
  when used (reports kept in memory, sent once per extender tick and queue).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from django_delayqueue.core import Queue
from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.contracts import ACK

from .base_scripts import PackageAt, script_at
from .deliver import CHILD, report_of, schedule_due_at_once
from .harness import PAYLOAD_100, Bench, Child, Row, at_least, at_most
from .sizes import Sizes

# The last commit of main before progress: its ack.lua and its consumer are the baseline.
BASE_REF = "53e8304"
REPORTS_PER_MESSAGE = 10


def progress_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    rows = ack_cost(bench, sizes)
    rows += deliver_against_base(bench, sizes)
    rows += deliver_reporting(bench, sizes)
    return rows


def _base_ref() -> str:
    return os.environ.get("BENCH_BASE_REF", BASE_REF)


# --- what deleting progress costs an ack ------------------------------------------------------


def base_ack_script() -> LuaScript | None:
    """ack.lua of the base (None when the base has progress already)."""
    return script_at(_base_ref(), "ack", "progress")


def ack_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    base = base_ack_script()
    q = Queue(bench.client, "bench-ack-cost")
    messages = max(2000, sizes.delivery // 10)
    rows = []
    for batch in (1, 100):
        ratios, ours_us, base_us = [], [], []
        for round_ in range(2 * sizes.rounds - 1):  # the ack of 1 is short: noise weighs more
            order = [(ACK.script, True), (base, False)]
            if round_ % 2 == 0:
                order.reverse()
            measured: dict[bool, float] = {}
            for script, is_now in order:
                if script is not None:
                    measured[is_now] = _ack_us(bench, q, script, is_now, batch, messages)
            ours_us.append(measured[True])
            if base is not None:
                ratios.append(measured[True] / measured[False])
                base_us.append(measured[False])
        ratio = statistics.median(ratios) if ratios else None
        rows.append(
            Row(
                f"progress.ack_us.b{batch}",
                f"Redis time per ack of {batch}, no progress reported, {messages:,} in flight",
                statistics.median(ours_us),
                "us",
                statistics.median(base_us) if base_us else None,
                f"ack.lua of {_base_ref()} (before progress)",
                ratio,
                # The ack of one message runs about a dozen commands: one HDEL more (on a key
                # that does not exist) is a few percent of it; a batch of 100 shares it.
                "<= 1.1x base" if batch == 1 else "<= 1.05x base",
                at_most(ratio, 1.1 if batch == 1 else 1.05),
                note="median of interleaved rounds; server time from INFO commandstats"
                if base is not None
                else f"no ack.lua before progress at {_base_ref()!r} (git show): not compared",
            )
        )
    return rows


def _ack_us(bench: Bench, q: Queue, script: LuaScript, is_now: bool, batch: int, n: int) -> float:
    """Redis microseconds per ack of ``batch`` while acking ``n`` claimed messages."""
    bench.flush()
    for start in range(0, n, 10_000):
        q.schedule_many([{"payload": PAYLOAD_100} for _ in range(min(10_000, n - start))])
    claimed = []
    while len(claimed) < n:
        got = q.claim(1000)
        if not got:
            break
        claimed += got
    client = bench.client
    client.script_load(script.source)
    keys = ACK.keys_for(q.keys)
    call_keys = keys if is_now else keys[:-1]  # the base has no progress key
    head = [q.clock.now_ms(), *q.announce_args]
    client.config_resetstat()
    for start in range(0, len(claimed), batch * 100):
        pipe = client.pipeline(transaction=False)
        for at in range(start, min(start + batch * 100, len(claimed)), batch):
            pairs = [part for m in claimed[at : at + batch] for part in (m.id, m.token)]
            pipe.execute_command("EVALSHA", script.sha, len(call_keys), *call_keys, *head, *pairs)
        pipe.execute()
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])


# --- delivery: this checkout against the base, and reporting against not ----------------------


def _run(
    bench: Bench, count: int, timeout: float, extra: list[str], root: Path | None
) -> tuple[float, float]:
    """Delivery of ``count`` messages due at once: (msg/s, consumer CPU us per message)."""
    queue = Queue(bench.client, "bench-progress-deliver")
    schedule_due_at_once(queue, count, {"order": 1})
    args = [*CHILD, "--url", bench.url, "--queue", queue.name, "--concurrency", "8",
            "--count", str(count), *extra]  # fmt: skip
    child = Child(args, cwd=root)
    report = report_of(child.wait(timeout)[0])
    bench.flush()
    return count / (report["elapsed_ns"] / 1e9), report["cpu_ns"] / count / 1000


def deliver_against_base(bench: Bench, sizes: Sizes) -> list[Row]:
    count = min(sizes.delivery, 20_000)
    base = PackageAt(_base_ref(), ("django_delayqueue", "bench"))
    try:
        ratios, ours, theirs = [], [], []
        cpu_ratios, cpu_ours, cpu_theirs = [], [], []
        # More rounds than elsewhere: two processes on a shared host vary by +-25 % a round.
        for round_ in range(2 * sizes.rounds - 1 if base.root is not None else 1):
            order = [True, False] if round_ % 2 else [False, True]
            measured, cpu = {}, {}
            for is_now in order:
                if is_now or base.root is not None:
                    root = None if is_now else base.root
                    measured[is_now], cpu[is_now] = _run(bench, count, sizes.timeout, [], root)
            ours.append(measured[True])
            cpu_ours.append(cpu[True])
            if base.root is not None:
                ratios.append(measured[True] / measured[False])
                theirs.append(measured[False])
                cpu_ratios.append(cpu[True] / cpu[False])
                cpu_theirs.append(cpu[False])
    finally:
        base.close()
    ratio = statistics.median(ratios) if ratios else None
    cpu_ratio = statistics.median(cpu_ratios) if cpu_ratios else None
    missing = f"no checkout of {_base_ref()!r} (git archive): not compared"
    return [
        Row(
            "progress.deliver",
            f"delivery, {count:,} due at once, concurrency 8, handlers report no progress",
            statistics.median(ours),
            "msg/s",
            statistics.median(theirs) if theirs else None,
            f"the consumer of {_base_ref()} (before progress), interleaved rounds",
            ratio,
            ">= 0.9x (noise of a shared host)",
            at_least(ratio, 0.9),
            note="" if ratios else missing,
        ),
        Row(
            "progress.deliver_cpu",
            "the same runs: the consumer process's CPU time per message",
            statistics.median(cpu_ours),
            "us",
            statistics.median(cpu_theirs) if cpu_theirs else None,
            f"the consumer of {_base_ref()} (before progress), interleaved rounds",
            cpu_ratio,
            "<= 1.1x base",
            at_most(cpu_ratio, 1.1),
            note="" if cpu_ratios else missing,
        ),
    ]


def deliver_reporting(bench: Bench, sizes: Sizes) -> list[Row]:
    count = min(sizes.delivery, 20_000)
    ratios, reporting, quiet, cpu_ratios = [], [], [], []
    for round_ in range(sizes.rounds):
        order = [True, False] if round_ % 2 else [False, True]
        measured, cpu = {}, {}
        for reports in order:
            extra = ["--progress", str(REPORTS_PER_MESSAGE)] if reports else []
            measured[reports], cpu[reports] = _run(bench, count, sizes.timeout, extra, None)
        ratios.append(measured[True] / measured[False])
        cpu_ratios.append(cpu[True] / cpu[False])
        reporting.append(measured[True])
        quiet.append(measured[False])
    ratio = statistics.median(ratios)
    return [
        Row(
            "progress.deliver_reporting",
            f"delivery, {count:,} due at once, concurrency 8, "
            f"{REPORTS_PER_MESSAGE} progress reports per message",
            statistics.median(reporting),
            "msg/s",
            statistics.median(quiet),
            "the same handlers reporting nothing (interleaved rounds)",
            ratio,
            "reported only",
            None,
            extra={"cpu_ratio": statistics.median(cpu_ratios)},
        )
    ]
