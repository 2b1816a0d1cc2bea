"""Flow control (issue 27): a queue's rate limit across three ``runqueue`` processes, and what
the limits cost a claim when unused, and when set but never reached.

    python -m bench --only rate_limit [--quick]

- ``rate_limit.claim_us.*``: Redis time per claim (``INFO commandstats``, microseconds) of
  claim.lua as it is now without limits against claim.lua of the base branch (``git show
  $BENCH_BASE_REF:…``, default the last commit before flow control), interleaved rounds on
  the same ready list: what the feature costs a queue that does not use it. Claims of 1 and
  of 100 messages.
- ``rate_limit.deliver``: delivery (messages due at once, one consumer process, concurrency 8)
  with a rate limit and a cap set far above what is reached, against none: interleaved rounds.
- ``rate_limit.window_*``: three ``runqueue`` processes (concurrency 4 each) on a queue with
  ``rate_limit: "50/s"`` and 2,000 messages due at once: the achieved rate over every 5 s
  window (sliding by 250 ms) within 5 % of 50/s, and the most claims (and handler starts) in
  any 1 s window never above the bucket's burst plus one second's rate (1 + 50). The limiter
  decides claims: its exactness is read on the claim instants; handler starts (wall clock) add
  the jitter of threads on a loaded host.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from django_delayqueue.core import Queue
from django_delayqueue.core.envelope import ENVELOPE_FORMAT
from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.contracts import CLAIM

from .base_scripts import script_at
from .deliver import CHILD, report_of, schedule_due_at_once
from .djapp.apps import RATE_CLAIMS, RATE_STARTS
from .djapp.settings import RATE_QUEUE
from .harness import PAYLOAD_100, Bench, Child, Row, at_least, at_most, wait_until
from .sizes import Sizes

RATE = 50.0  # per second: the queue's "50/s" (bench/djapp/settings.py)
BURST = 1


def rate_limit(bench: Bench, sizes: Sizes) -> list[Row]:
    rows = claim_cost(bench, sizes)
    rows += deliver_with_and_without(bench, sizes)
    rows += three_runqueues(bench, sizes)
    return rows


# --- what an unused limit costs a claim -----------------------------------------------------

# The last commit of main before flow control (issue 27): its claim.lua is the baseline once
# main has the feature (``main`` itself then has nothing to compare with).
BASE_REF = "db6a334"


def base_claim_script() -> LuaScript | None:
    """claim.lua of the base branch (None when it has flow_limits.lua already)."""
    return script_at(os.environ.get("BENCH_BASE_REF", BASE_REF), "claim", "flow_limits")


def claim_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    base = base_claim_script()  # None: no base to compare with (ours is measured alone)
    now = CLAIM.script
    q = Queue(bench.client, "bench-claim-cost")
    keys = CLAIM.keys_for(q.keys)  # ready .. ranked, limiter
    messages = max(2000, sizes.delivery // 10)
    ref = os.environ.get("BENCH_BASE_REF", BASE_REF)
    rows = []
    for batch in (1, 100):
        ratios, ours_us, base_us = [], [], []
        for round_ in range(sizes.rounds):
            order = [(now, True), (base, False)] if round_ % 2 else [(base, False), (now, True)]
            measured: dict[bool, float] = {}
            for script, is_now in order:
                if script is not None:
                    measured[is_now] = _claim_us(bench, q, script, keys, is_now, batch, messages)
            ours_us.append(measured[True])
            if base is not None:
                ratios.append(measured[True] / measured[False])
                base_us.append(measured[False])
        ratio = statistics.median(ratios) if ratios else None
        rows.append(
            Row(
                f"rate_limit.claim_us.b{batch}",
                f"Redis time per claim of {batch}, no limit set, {messages:,} ready",
                statistics.median(ours_us),
                "us",
                statistics.median(base_us) if base_us else None,
                f"claim.lua of {ref} (before flow limits)",
                ratio,
                "<= 1.05x base",
                at_most(ratio, 1.05),
                note="median of interleaved rounds; server time from INFO commandstats"
                if base is not None
                else f"no claim.lua before flow limits at {ref!r} (git show): not compared",
            )
        )
    return rows


def _claim_us(
    bench: Bench, q: Queue, script: LuaScript, keys: list[str], is_now: bool, batch: int, n: int
) -> float:
    """Redis microseconds per claim of ``batch`` while claiming ``n`` ready messages."""
    bench.flush()
    for start in range(0, n, 10_000):
        q.schedule_many([{"payload": PAYLOAD_100} for _ in range(min(10_000, n - start))])
    client = bench.client
    client.script_load(script.source)
    call_keys = keys if is_now else keys[:-1]  # the base has no limiter key
    stamp = q.clock.now_ms()
    args = [stamp, stamp + 60_000, batch] + (["", ENVELOPE_FORMAT] if is_now else [])
    client.config_resetstat()
    calls = n // batch
    for start in range(0, calls, 100):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(100, calls - start)):
            pipe.execute_command("EVALSHA", script.sha, len(call_keys), *call_keys, *args)
        pipe.execute()
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])


# --- delivery with limits set but never reached ---------------------------------------------


def deliver_with_and_without(bench: Bench, sizes: Sizes) -> list[Row]:
    count = min(sizes.delivery, 20_000)
    unreached = ["--rate-limit", "1000000/s burst 100000", "--max-in-flight", "1000000"]
    ratios, with_rates, without_rates = [], [], []
    for round_ in range(sizes.rounds):
        order = [True, False] if round_ % 2 else [False, True]
        measured = {}
        for limited in order:
            queue = Queue(bench.client, "bench-rate-deliver")
            schedule_due_at_once(queue, count, {"order": 1})
            extra = unreached if limited else []
            child = Child(
                [*CHILD, "--url", bench.url, "--queue", queue.name, "--concurrency", "8",
                 "--count", str(count), *extra]
            )  # fmt: skip
            report = report_of(child.wait(sizes.timeout)[0])
            measured[limited] = count / (report["elapsed_ns"] / 1e9)
            bench.flush()
        ratios.append(measured[True] / measured[False])
        with_rates.append(measured[True])
        without_rates.append(measured[False])
    ratio = statistics.median(ratios)
    return [
        Row(
            "rate_limit.deliver",
            f"delivery, {count:,} due at once, concurrency 8, a rate limit and a cap never reached",
            statistics.median(with_rates),
            "msg/s",
            statistics.median(without_rates),
            "the same without limits (interleaved rounds)",
            ratio,
            ">= 0.9x (noise of a shared host)",
            at_least(ratio, 0.9),
        )
    ]


# --- three runqueue processes sharing one rate ------------------------------------------------


def three_runqueues(bench: Bench, sizes: Sizes) -> list[Row]:
    count = sizes.rate_limit_messages
    window_ms = sizes.rate_limit_window_seconds * 1000
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
            "BENCH_REDIS_URL": bench.url,
            "BENCH_DB": str(Path(tmp) / "bench.sqlite3"),
        }
        Child(["-m", "django", "migrate", "-v", "0"], env).wait(sizes.timeout)
        queue = Queue(bench.client, RATE_QUEUE)
        schedule_due_at_once(queue, count, {"order": 1})
        children = [
            Child(["-m", "django", "runqueue", RATE_QUEUE, "-v", "0"], env, quiet=True)
            for _ in range(3)
        ]
        try:
            expected = count / RATE + 60
            if not wait_until(lambda: bench.client.llen(RATE_STARTS) >= count, expected):
                raise RuntimeError(f"rate_limit: {count} messages not started in {expected:.0f}s")
        finally:
            for child in children:
                child.stop(60)
                child.kill()
        starts = sorted(float(x) for x in bench.client.lrange(RATE_STARTS, 0, -1))
        claims = sorted(float(x) for x in bench.client.lrange(RATE_CLAIMS, 0, -1))
        throttled = int(bench.client.hget(queue.keys.limiter, "throttled") or 0)
    bench.flush()
    rates = window_rates(starts, window_ms, step_ms=250)
    lowest, highest = min(rates), max(rates)
    most_1s = most_in_window(starts, 1000)
    most_1s_claimed = most_in_window(claims, 1000)
    overall = (len(starts) - 1) / (starts[-1] - starts[0]) * 1000
    spec = f"3 runqueue x concurrency 4, rate_limit 50/s, {count:,} due at once"
    common = {"windows": len(rates), "overall_rate": overall, "throttled": throttled}
    return [
        Row("rate_limit.window_min", f"lowest rate over a {window_ms / 1000:g} s window ({spec})",
            lowest, "msg/s", target=">= 47.5 (50 - 5 %)", ok=lowest >= RATE * 0.95,
            extra=common, note=f"overall {overall:.2f}/s; {throttled} throttled"),
        Row("rate_limit.window_max", f"highest rate over a {window_ms / 1000:g} s window ({spec})",
            highest, "msg/s", target="<= 52.5 (50 + 5 %)", ok=highest <= RATE * 1.05),
        Row("rate_limit.burst_claimed", f"most claims in any 1 s window ({spec})",
            most_1s_claimed, "msg", target=f"<= {BURST + int(RATE)} (burst + 1 s of rate)",
            ok=most_1s_claimed <= BURST + RATE,
            note="the instants the limiter decided on (each claiming round's now, at most a "
            "claim lead before its token)"),
        Row("rate_limit.burst_started", f"most handler starts in any 1 s window ({spec})",
            most_1s, "msg", target=f"<= {BURST + int(RATE)} (burst + 1 s of rate)",
            ok=most_1s <= BURST + RATE,
            note="the handlers' wall clock: a thread that starts late on a loaded host bunches "
            "with the next one"),
    ]  # fmt: skip


def window_rates(starts: list[float], window_ms: float, step_ms: float) -> list[float]:
    """Starts per second over every window of ``window_ms`` inside the run, slid by
    ``step_ms`` (a window reaching past the last start is not counted: the run ended)."""
    rates = []
    at, j, k = starts[0], 0, 0
    while at + window_ms <= starts[-1]:
        while j < len(starts) and starts[j] < at:
            j += 1
        while k < len(starts) and starts[k] < at + window_ms:
            k += 1
        rates.append((k - j) / (window_ms / 1000))
        at += step_ms
    return rates or [len(starts) / max(1e-9, (starts[-1] - starts[0]) / 1000)]


def most_in_window(starts: list[float], window_ms: float) -> int:
    """The most starts in any window of ``window_ms`` (each start opening one)."""
    most, k = 0, 0
    for i, start in enumerate(starts):
        while k < len(starts) and starts[k] < start + window_ms:
            k += 1
        most = max(most, k - i)
    return most
