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
messages due at once, enqueued before the consumer starts: first start to last finish), each
the median of ``--runs`` runs, and the Redis commands per message of each (``INFO
commandstats`` deltas on the bench's own redis-server, calls made inside Lua scripts included,
the bench's own polls left out: enqueue and delivery apart, then end to end); then the lateness
of messages due at a steady rate (start minus due time: p50, p99, max, and how many started
early). Targets (issues 13 and 26): the tasks path delivers at least half the signal path's
rate, lateness p99 within 5 ms, no task early. Which Tasks framework ran (Django's
``django.tasks`` or the ``django-tasks`` backport) is printed and kept in the JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
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
DELIVERY_RATIO_TARGET = 0.7  # issue 37: as bench.cost_ab.RATIO_TARGET
LATENESS_P99_TARGET_MS = 5.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "tasks_path.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.tasks_path", description=__doc__)
    p.add_argument("--count", type=int, default=20000, help="messages due at once (delivery)")
    p.add_argument("--runs", type=int, default=3, help="delivery runs per path (the median)")
    p.add_argument(
        "--timed", type=int, default=1000, help="messages due at a steady rate (0: no lateness)"
    )
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
            "its row is left out (pip install django-tasks-redis in .venv-django6)")  # fmt: skip
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
            runs = []
            for run in range(1, args.runs + 1):
                log(f"{path}: {args.count} due at once (run {run} of {args.runs}) ...")
                runs.append(run_delivery(path, env, client, args))
            results[path] = {**medians(runs), "runs": runs}
            if args.timed:
                log(f"{path}: {args.timed} due at {args.rate:g}/s ...")
                results[path].update(run_lateness(path, env, client, args))
    report(results, args)
    return 0


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median of the runs (a run whose delivery was not timed counts as 0)."""
    return {name: statistics.median(r[name] or 0 for r in runs) for name in runs[0]}


class CommandCount:
    """Commands the redis-server ran since :meth:`reset` (``INFO commandstats``: each call
    inside a Lua script counts too), less the bench's own: INFO, CONFIG and ``own`` more."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.own = 0  # the bench's own commands since reset (its polls)

    def reset(self) -> None:
        self.client.config_resetstat()
        self.own = 0

    def taken(self) -> int:
        stats = self.client.info("commandstats")
        calls = sum(
            int(v["calls"])
            for name, v in stats.items()
            if not name.startswith(("cmdstat_info", "cmdstat_config"))
        )
        return calls - self.own


def run_delivery(
    path: str, env: dict[str, str], client: redis.Redis, args: argparse.Namespace
) -> dict[str, Any]:
    commands = CommandCount(client)
    commands.reset()
    produced = produce(path, env, args.count, 0.0, 0.0, args.timeout)
    enqueue_commands = commands.taken()
    commands.reset()
    cpu_before = _children_cpu()
    consumer = start_consumer(path, env, args.count)
    try:
        wait_for_done(path, client, consumer, args.timeout, commands)
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    delivery_commands = commands.taken()
    consumer_cpu = _children_cpu() - cpu_before  # its start and stop included
    first, done = float(client.get(FIRST)), float(client.get(DONE))
    client.flushdb()
    return {
        "enqueue_per_s": args.count / (produced["elapsed_ns"] / 1e9),
        "delivery_per_s": args.count / (done - first) if done > first else None,
        "enqueue_commands_per_message": enqueue_commands / args.count,
        "delivery_commands_per_message": delivery_commands / args.count,
        "commands_per_message": (enqueue_commands + delivery_commands) / args.count,
        "consumer_cpu_us_per_message": consumer_cpu * 1e6 / args.count,
    }


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
    late = collected_lateness(client, args.timed, path)
    return {
        "lateness_ms": {
            "p50": statistics.median(late),
            "p99": late[min(len(late) - 1, int(len(late) * 0.99))],
            "max": late[-1],
        },
        "early": sum(1 for v in late if v < 0),
    }


def collected_lateness(client: redis.Redis, expected: int, what: str) -> list[float]:
    """The start lateness (ms) the timed messages' receivers pushed, sorted; the database then
    emptied for the next run. Raises when not all ``expected`` of them ran."""
    late = sorted(float(v) for v in client.lrange(LATENESS, 0, -1))
    client.flushdb()
    if len(late) != expected:
        raise RuntimeError(f"{what}: {len(late)} of {expected} timed messages ran")
    return late


def wait_for_done(
    path: str,
    client: redis.Redis,
    consumer: Child,
    timeout: float,
    commands: CommandCount | None = None,
) -> None:
    """Until the last message ran; a consumer that exits first fails the run with its output.
    Its polls are the bench's own commands, not the path's (``commands``)."""

    def ended() -> bool:
        if commands is not None:
            commands.own += 1
        return bool(client.exists(DONE)) or consumer.proc.poll() is not None

    wait_until(ended, timeout, interval=0.05)
    if commands is not None:
        commands.own += 1
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
    print(
        f"{args.count:,} messages due at once, median of {args.runs} run(s); Tasks framework: "
        f"{framework_name()}; Redis commands per message (calls inside scripts included); "
        "cpu us: the consumer process's CPU per message delivered (its start included)"
    )
    head = ("path", "enqueue/s", "delivery/s", "cmd enq", "cmd deliv", "cmd all", "cpu us")
    print("{:<20} {:>10} {:>11} {:>8} {:>9} {:>8} {:>7}".format(*head))
    for path, r in results.items():
        row = (path, r["enqueue_per_s"], r["delivery_per_s"] or 0)
        commands = (r["enqueue_commands_per_message"], r["delivery_commands_per_message"])
        print(
            "{:<20} {:>10,.0f} {:>11,.0f}".format(*row)
            + " {:>8.1f} {:>9.1f} {:>8.1f}".format(*commands, r["commands_per_message"])
            + " {:>7.0f}".format(r["consumer_cpu_us_per_message"])
        )
    checks = {f"tasks delivery >= {DELIVERY_RATIO_TARGET}x signal": ratio >= DELIVERY_RATIO_TARGET}
    if args.timed:
        print(f"\n{args.timed:,} due at {args.rate:g}/s: lateness (ms)")
        head = ("path", "p50", "p99", "max", "early")
        print("{:<20} {:>8} {:>8} {:>8} {:>6}".format(*head))
        for path, r in results.items():
            lat = r["lateness_ms"]
            row = (path, lat["p50"], lat["p99"], lat["max"], r["early"])
            print("{:<20} {:>8.1f} {:>8.1f} {:>8.1f} {:>6}".format(*row))
        checks["tasks lateness p99 <= 5 ms"] = tasks["lateness_ms"]["p99"] <= LATENESS_P99_TARGET_MS
        checks["no task early"] = tasks["early"] == 0
    print(f"tasks / signal delivery: {ratio:.2f}x")
    for name, ok in checks.items():
        print(f"  {name}: {'ok' if ok else 'MISSED'}")
    out = {
        "count": args.count,
        "runs": args.runs,
        "framework": framework_name(),
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


def framework_name() -> str:
    """The Tasks framework the bench's children run: Django's own, or the backport."""
    if importlib.util.find_spec("django.tasks") is not None:
        import django

        return f"django.tasks (Django {django.get_version()})"
    from importlib.metadata import version

    return f"django_tasks backport {version('django-tasks')} (Django {version('django')})"


def log(text: str) -> None:
    print(f"[tasks_path] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
