"""Soak run: many messages, randomized handler failures, consumers killed and Redis restarted
on a schedule, then an exact account of what was delivered.

    python -m bench.soak --messages 1000000          # the default size
    python -m bench.soak --messages 20000 --json r.json

It starts its own redis-server (AOF with ``appendfsync always``, so a ``kill -9`` of Redis loses no
acknowledged write), ``--consumers`` consumer processes
(``tests/support/programs/fault_consumer.py``) and a producer thread that schedules the messages
with explicit ids, due at a steady ``--rate``. While they run, a chaos loop ``kill -9``s a random
consumer every ``--kill-every`` seconds (a supervisor starts a new one) and restarts Redis every
``--redis-every`` seconds, alternating ``kill -9`` and a clean shutdown. Handlers raise on
``--fail-rate`` of deliveries and end their own process on ``--exit-rate``.

Every delivery is appended to a ledger (``tests/support/ledger.py``; not fsync'd here: a killed
process loses nothing the kernel already has, and the machine itself is not crashed). The report
says how many were scheduled and delivered, how many were lost (must be 0), duplicates by cause
(unexplained must be 0), early deliveries (must be 0), and percentiles of lateness (first delivery
- due time) and of redelivery delay (delivery - previous delivery of the same id). The exit code is
1 when a must-be-0 figure is not.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the ledger and the drill helpers

from drill import Consumers, producer  # noqa: E402
from ledger import Causes, Delivery, check, read  # noqa: E402

from django_delayqueue.core import DelayQueueError  # noqa: E402
from django_delayqueue.embedded import RedisServerProcess  # noqa: E402

QUEUE = "soak"
VISIBILITY = 3.0


@dataclass
class Chaos:
    killed_pids: set[int] = field(default_factory=set)
    consumer_kills: int = 0
    consumer_deaths: int = 0  # ended by their own handler (--exit-rate)
    redis_kills: int = 0
    redis_restarts: int = 0
    outages: list[tuple[int, int]] = field(default_factory=list)


class Feed(threading.Thread):
    """Schedules ``count`` messages due at ``rate`` per second, retrying failed chunks."""

    def __init__(self, url: str, count: int, rate: float, lead: float, chunk: int = 500) -> None:
        super().__init__(daemon=True, name="soak-producer")
        self.queue = producer(url, QUEUE)
        self.count, self.rate, self.lead, self.chunk = count, rate, lead, chunk
        self.due: dict[str, int] = {}
        self.failures = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._feed()
        except Exception as e:  # reported by the main loop, not lost in a thread
            self.error = f"producer failed: {type(e).__name__}: {e}"

    def _feed(self) -> None:
        start = self.queue.clock.now_ms() + int(self.lead * 1000)
        for first in range(0, self.count, self.chunk):
            items = [
                {"id": f"s{i}", "payload": {"i": i}, "at": start + int(i * 1000 / self.rate)}
                for i in range(first, min(first + self.chunk, self.count))
            ]
            # Stay about `lead` seconds ahead of the due times, as a real producer would.
            ahead = (items[0]["at"] - self.queue.clock.now_ms()) / 1000 - self.lead
            if ahead > 0:
                time.sleep(ahead)
            for _ in range(600):  # Redis restarts take ~1 s; give up after ~2 minutes
                try:
                    self.queue.schedule_many(items)
                    break
                except DelayQueueError:
                    self.failures += 1
                    time.sleep(0.2)
            else:
                self.error = f"could not schedule {items[0]['id']}..: Redis stayed down"
                return
            self.due.update((item["id"], item["at"]) for item in items)


def percentiles(values: list[int]) -> dict[str, int | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "p99.9": None, "max": None}
    s = sorted(values)

    def at(q: float) -> int:
        return s[min(len(s) - 1, int(q * len(s)))]

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "p99.9": at(0.999), "max": s[-1]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="delayqueue-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ledger_path = workdir / "ledger.jsonl"
    rng = random.Random(args.seed)
    chaos = Chaos()
    server = RedisServerProcess(args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    group = Consumers(
        server.url,
        QUEUE,
        workdir,
        ledger=ledger_path,
        no_fsync=True,
        visibility=VISIBILITY,
        max_attempts=args.max_attempts,
        fail_rate=args.fail_rate,
        exit_rate=args.exit_rate,
        concurrency=args.concurrency,
        claim_batch=args.claim_batch,
        socket_timeout=5,
    )
    started = time.monotonic()
    try:
        procs = [group.start() for _ in range(args.consumers)]
        feed = Feed(server.url, args.messages, args.rate, lead=2.0)
        feed.start()
        q = producer(server.url, QUEUE)
        next_kill = time.monotonic() + args.kill_every
        next_redis = time.monotonic() + args.redis_every
        deadline = time.monotonic() + args.messages / args.rate + args.timeout
        while True:
            now = time.monotonic()
            assert now < deadline, f"soak did not settle in time; logs in {workdir}"
            for i, p in enumerate(procs):  # the supervisor
                if p.poll() is not None:
                    chaos.killed_pids.add(p.pid)
                    chaos.consumer_deaths += 1
                    procs[i] = group.start()
            producing = feed.is_alive()
            if producing and args.kill_every and now >= next_kill:
                victim = rng.randrange(len(procs))
                chaos.killed_pids.add(procs[victim].pid)
                procs[victim].kill()
                procs[victim].wait()
                chaos.consumer_kills += 1
                procs[victim] = group.start()
                next_kill = now + args.kill_every
            if producing and args.redis_every and now >= next_redis:
                begin = int(time.time() * 1000)
                if chaos.redis_kills <= chaos.redis_restarts:
                    server.kill()
                    chaos.redis_kills += 1
                    time.sleep(0.5)
                else:
                    chaos.redis_restarts += 1  # clean: SIGTERM, Redis fsyncs and exits
                server.restart()
                chaos.outages.append((begin, int(time.time() * 1000)))
                next_redis = time.monotonic() + args.redis_every
            if not producing:
                if feed.error:
                    raise RuntimeError(feed.error)
                try:
                    counts = q.counts()
                except DelayQueueError:
                    counts = None
                if counts and all(counts[s] == 0 for s in ("pending", "ready", "unack", "retry")):
                    break
            time.sleep(0.1)
        for p in procs:
            group.stop(p, timeout=30)
        garbage = q.counts()["garbage"]
    finally:
        group.close()
        server.stop()
    elapsed = time.monotonic() - started
    return report(args, feed, read(ledger_path), chaos, garbage, elapsed, workdir)


def report(
    args: argparse.Namespace,
    feed: Feed,
    deliveries: list[Delivery],
    chaos: Chaos,
    garbage: int,
    elapsed: float,
    workdir: Path,
) -> dict[str, Any]:
    causes = Causes(
        chaos.killed_pids, chaos.outages, outage_margin_ms=int(VISIBILITY * 1000) + 2000
    )
    result = check(feed.due, deliveries, causes)
    first: dict[str, Delivery] = {}
    by_id: dict[str, list[Delivery]] = {}
    for d in sorted(deliveries, key=lambda d: (d.delivered_ms, d.attempt)):
        first.setdefault(d.id, d)
        by_id.setdefault(d.id, []).append(d)
    lateness = [d.delivered_ms - feed.due[d.id] for d in first.values() if d.id in feed.due]
    redelivery = [b.delivered_ms - a.delivered_ms for r in by_id.values() for a, b in pairwise(r)]
    return {
        "messages": args.messages,
        "scheduled": result.scheduled,
        "delivered": result.delivered,
        "distinct_delivered": result.distinct,
        "lost": len(result.lost),
        "unknown": len(result.unknown),
        "early": len(result.early),
        "duplicates": sum(result.duplicates.values()),
        "duplicates_by_cause": dict(result.duplicates),
        "unexplained_duplicates": len(result.unexplained),
        "dead_letters": garbage,
        "lateness_ms": percentiles(lateness),
        "redelivery_delay_ms": percentiles(redelivery),
        "chaos": {
            "consumer_kills": chaos.consumer_kills,
            "consumer_self_exits": chaos.consumer_deaths,
            "redis_kill_9": chaos.redis_kills,
            "redis_clean_restarts": chaos.redis_restarts,
            "producer_retries": feed.failures,
        },
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")},
        "elapsed_seconds": round(elapsed, 1),
        "workdir": str(workdir),
        "examples": {
            "lost": result.lost[:5],
            "early": [asdict(d) for d in result.early[:5]],
            "unexplained": [[asdict(a), asdict(b)] for a, b in result.unexplained[:5]],
        },
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("scheduled", r["scheduled"]),
        ("delivered (incl. redeliveries)", r["delivered"]),
        ("lost (must be 0)", r["lost"]),
        ("delivered but never scheduled", r["unknown"]),
        ("early deliveries (must be 0)", r["early"]),
        ("duplicates", r["duplicates"]),
        *((f"  {cause}", n) for cause, n in sorted(r["duplicates_by_cause"].items())),
        ("unexplained duplicates (must be 0)", r["unexplained_duplicates"]),
        ("dead letters (attempts used up)", r["dead_letters"]),
        *((f"chaos: {k}", v) for k, v in r["chaos"].items()),
        *((f"lateness ms {k}", v) for k, v in r["lateness_ms"].items()),
        *((f"redelivery delay ms {k}", v) for k, v in r["redelivery_delay_ms"].items()),
        ("elapsed s", r["elapsed_seconds"]),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def ok(r: dict[str, Any]) -> bool:
    return r["lost"] == r["unknown"] == r["early"] == r["unexplained_duplicates"] == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=4000, help="messages falling due per second")
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--claim-batch", type=int, default=50)
    p.add_argument("--max-attempts", type=int, default=8)
    p.add_argument("--fail-rate", type=float, default=0.02)
    p.add_argument("--exit-rate", type=float, default=0.0002)
    p.add_argument("--kill-every", type=float, default=5.0, help="seconds; 0: never")
    p.add_argument("--redis-every", type=float, default=15.0, help="seconds; 0: never")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to drain after the feed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="soak-report.json")
    p.add_argument("--workdir")
    args = p.parse_args(argv)
    result = run(args)
    print(table(result))
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"report written to {args.json}")
    return 0 if ok(result) else 1


if __name__ == "__main__":
    sys.exit(main())
