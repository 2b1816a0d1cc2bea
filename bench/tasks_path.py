"""Django's Tasks framework through this app, beside ``dq.schedule`` and django-tasks-redis.

    python -m bench.tasks_path                       # our two paths (+ the peer where it installs)
    .venv-django6/bin/python -m bench.tasks_path     # with django-tasks-redis (Python 3.12+)

Three paths do the same work (a no-op that notes when it started) in the same run, each with
one consumer process on its own Redis database of one redis-server the bench starts:

- ``signal``: ``dq.schedule`` to a queue whose signal receiver does the work (``runqueue``);
- ``tasks``: ``@task`` + ``.using(run_after=...).enqueue`` on ``DelayQueueBackend``
  (``runqueue``), results included;
- ``django-tasks-redis``: the same task on the peer's backend (``run_redis_tasks``), when the
  package is installed (it needs Django 6 and Python 3.12).

For each: the enqueue rate (one process, one message after another), the delivery rate (N
messages due at once, enqueued before the consumer starts: first start to last finish), and
the lateness of messages due at a steady rate (start minus due time: p50, p99, max, and how
many started early). Targets (issue 13): the tasks path delivers at least half the signal
path's rate, lateness p99 within 5 ms, no task early.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess

from .djapp.timing import DONE, FIRST, LATENESS
from .harness import Child, wait_until

PATHS = ("signal", "tasks", "django-tasks-redis")
DELIVERY_RATIO_TARGET = 0.5
LATENESS_P99_TARGET_MS = 5.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "tasks_path.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.tasks_path", description=__doc__)
    p.add_argument("--count", type=int, default=5000, help="messages due at once (delivery)")
    p.add_argument("--timed", type=int, default=1000, help="messages due at a steady rate")
    p.add_argument("--rate", type=float, default=200.0, help="of those, due per second")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    peer = importlib.util.find_spec("django_tasks_redis") is not None
    paths = [p for p in PATHS if p != "django-tasks-redis" or peer]
    if not peer:
        log("django-tasks-redis is not installed here (it needs Django 6 and Python 3.12+): "
            "its row is left out; run with .venv-django6/bin/python for it")  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    with RedisServerProcess() as server, tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        for db, path in enumerate(paths, start=1):
            url = server.url.rsplit("/", 1)[0] + f"/{db}"
            env = {
                "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
                "BENCH_REDIS_URL": url,
                "BENCH_DB": str(Path(tmp) / f"{db}.sqlite3"),
                "BENCH_TASKS": "redis" if path == "django-tasks-redis" else "delayqueue",
            }
            Child(["-m", "django", "migrate", "-v", "0"], env).wait(args.timeout)
            client = redis.Redis.from_url(url)
            log(f"{path}: {args.count} due at once ...")
            delivery = run_delivery(path, env, client, args)
            log(f"{path}: {args.timed} due at {args.rate:g}/s ...")
            lateness = run_lateness(path, env, client, args)
            results[path] = {**delivery, **lateness}
    report(results, args)
    return 0


def run_delivery(
    path: str, env: dict[str, str], client: redis.Redis, args: argparse.Namespace
) -> dict[str, Any]:
    produced = produce(path, env, args.count, 0.0, 0.0, args.timeout)
    consumer = start_consumer(path, env, args.count)
    try:
        wait_for_done(path, client, consumer, args.timeout)
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    first, done = float(client.get(FIRST)), float(client.get(DONE))
    client.flushdb()
    return {
        "enqueue_per_s": args.count / (produced["elapsed_ns"] / 1e9),
        "delivery_per_s": args.count / (done - first) if done > first else None,
    }


def run_lateness(
    path: str, env: dict[str, str], client: redis.Redis, args: argparse.Namespace
) -> dict[str, Any]:
    consumer = start_consumer(path, env, args.timed)
    try:
        wait_for_consumer(path, client, consumer)
        spread = args.timed / args.rate
        produce(path, env, args.timed, spread, 2.0, args.timeout)  # the first due 2 s from now
        wait_for_done(path, client, consumer, args.timeout + spread)
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    late = sorted(float(v) for v in client.lrange(LATENESS, 0, -1))
    client.flushdb()
    if len(late) != args.timed:
        raise RuntimeError(f"{path}: {len(late)} of {args.timed} timed messages ran")
    return {
        "lateness_ms": {
            "p50": statistics.median(late),
            "p99": late[min(len(late) - 1, int(len(late) * 0.99))],
            "max": late[-1],
        },
        "early": sum(1 for v in late if v < 0),
    }


def wait_for_done(path: str, client: redis.Redis, consumer: Child, timeout: float) -> None:
    """Until the last message ran; a consumer that exits first fails the run with its output."""
    ended = lambda: client.exists(DONE) or consumer.proc.poll() is not None  # noqa: E731
    wait_until(ended, timeout)
    if not client.exists(DONE):
        if consumer.proc.poll() is None:
            consumer.proc.kill()
        _, err = consumer.proc.communicate()
        output = (err or "")[-3000:]
        raise RuntimeError(f"{path}: the last message did not run in {timeout}s:\n{output}")


def produce(
    path: str, env: dict[str, str], count: int, spread: float, lead: float, timeout: float
) -> dict[str, Any]:
    kind = "signal" if path == "signal" else "tasks"
    command = ["-m", "bench.djapp.enqueue", kind, str(count), str(spread), str(lead)]
    out, _ = Child(command, env).wait(timeout)
    return json.loads(out.strip().splitlines()[-1])


def start_consumer(path: str, env: dict[str, str], count: int) -> Child:
    if path == "django-tasks-redis":
        command = ["-m", "django", "run_redis_tasks", "--max-tasks", str(count), "--continuous"]
    else:
        queue = "bench-signal" if path == "signal" else "bench-tasks"
        command = ["-m", "django", "runqueue", queue, "--max-messages", str(count), "-v", "0"]
    return Child(command, env, quiet=True)  # the peer prints a line per task


def wait_for_consumer(path: str, client: redis.Redis, consumer: Child) -> None:
    """Ours listens on the queue's wake channel once it runs; the peer gets a fixed start."""
    if path == "django-tasks-redis":
        time.sleep(5.0)  # no signal to wait for: Django's start and its first XREADGROUP
        return
    queue = "bench-signal" if path == "signal" else "bench-tasks"
    channel = Queue(client, queue).keys.wake_channel
    if not wait_until(lambda: client.pubsub_numsub(channel)[0][1] > 0, 60):
        raise RuntimeError(f"{path}: runqueue did not start listening within 60 s")


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    signal = results["signal"]["delivery_per_s"] or 0
    tasks = results["tasks"]
    ratio = (tasks["delivery_per_s"] or 0) / signal if signal else 0
    head = ("path", "enqueue/s", "delivery/s", "p50 ms", "p99 ms", "max ms", "early")
    print("{:<20} {:>10} {:>11} {:>8} {:>8} {:>8} {:>6}".format(*head))
    for path, r in results.items():
        lat = r["lateness_ms"]
        row = (path, r["enqueue_per_s"], r["delivery_per_s"] or 0, lat["p50"], lat["p99"])
        print(
            "{:<20} {:>10,.0f} {:>11,.0f} {:>8.1f} {:>8.1f}".format(*row)
            + f" {lat['max']:>8.1f} {r['early']:>6}"
        )
    checks = {
        "tasks delivery >= 0.5x signal": ratio >= DELIVERY_RATIO_TARGET,
        "tasks lateness p99 <= 5 ms": tasks["lateness_ms"]["p99"] <= LATENESS_P99_TARGET_MS,
        "no task early": tasks["early"] == 0,
    }
    print(f"tasks / signal delivery: {ratio:.2f}x")
    for name, ok in checks.items():
        print(f"  {name}: {'ok' if ok else 'MISSED'}")
    out = {
        "count": args.count,
        "timed": args.timed,
        "rate": args.rate,
        "python": sys.version.split()[0],
        "paths": results,
        "tasks_signal_delivery_ratio": round(ratio, 3),
        "checks": checks,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    log(f"JSON: {args.json}")


def log(text: str) -> None:
    print(f"[tasks_path] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
