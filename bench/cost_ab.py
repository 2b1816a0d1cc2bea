"""The per-message cost, whole main against a base release, in the same run (issue 37, §1).

    python -m bench.cost_ab                          # this checkout against 0cc4333
    python -m bench.cost_ab --base <ref> --runs 3 --count 20000 --json bench/results/x.json
    python -m bench.cost_ab --ours HEAD --base main  # two commits (edits meanwhile are safe)

Each feature was measured alone as free; together they cost a fifth of delivery. So this bench
measures the whole package, as a user runs it: this checkout's ``django_delayqueue`` and the
base's (``git archive <ref>``, :class:`.base_scripts.PackageAt`), each with this checkout's
bench project (``bench.djapp``), on two paths:

- ``signal``: ``dq.schedule`` to a queue whose signal receiver does the work;
- ``tasks``: ``@task`` + ``.enqueue()`` on ``DelayQueueBackend``, results included.

Every producer and every consumer is a process of its own (``python -m bench.djapp.enqueue``,
``manage.py runqueue``), each tree and path on its own Redis database of one redis-server. A
round runs the four (tree, path) pairs one after another, every other round in reverse order,
so that a burst of load from the machine's other users falls on both trees alike; each figure
is the median over ``--runs`` rounds, and the tasks/signal ratio is the median of the per-round
ratios (the two paths of one tree, minutes apart at most). Per pair and round: enqueue/s (one
process, one message after another), delivery/s (``--count`` messages due at once, enqueued
before the consumer starts: first start to last finish), the consumer's CPU per message (its
start included), and the Redis commands per message end to end (``INFO commandstats``, the
calls inside scripts included, the bench's own polls left out). Then, once per pair, the
lateness of ``--timed`` messages due at ``--rate``/s (start minus due: p50, p99, early starts).

The machine's 1-minute load average is noted at each delivery run and printed with the table:
on a shared host a loaded minute slows every figure, and only the same-run ratios compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess

from .base_scripts import PackageAt, checkout_differs, commit_of
from .djapp.timing import DONE, FIRST
from .harness import ROOT, Child, wait_until
from .tasks_path import CommandCount, _children_cpu, collected_lateness, wait_for_done

BASE_REF = "0cc4333"  # the release before envelope formats: issue 37's "last month's code"
PATHS = ("signal", "tasks")
TREES = ("ours", "base")
QUEUES = {"signal": "bench-signal", "tasks": "bench-tasks"}
RATIO_TARGET = 0.7  # issue 37: the tasks path delivers at least 0.7x the signal path
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "cost_ab.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.cost_ab", description=__doc__)
    p.add_argument("--base", default=BASE_REF, help="the git ref to compare with")
    p.add_argument(
        "--ours", default="", help="a git ref to measure instead of this checkout's files"
    )
    p.add_argument("--count", type=int, default=20000, help="messages due at once (delivery)")
    p.add_argument("--runs", type=int, default=3, help="rounds (the medians)")
    p.add_argument("--timed", type=int, default=1000, help="lateness messages (0: none)")
    p.add_argument("--rate", type=float, default=200.0, help="of those, due per second")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p.parse_args(argv)


class Tree:
    """One package (``root`` None: this checkout's) with its own databases per path."""

    def __init__(self, name: str, root: Path | None, server_url: str, tmp: str, first_db: int):
        self.name, self.root = name, root
        self.env: dict[str, dict[str, str]] = {}
        self.clients: dict[str, redis.Redis] = {}
        for n, path in enumerate(PATHS):
            url = server_url.rsplit("/", 1)[0] + f"/{first_db + n}"
            env = {
                "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
                "BENCH_REDIS_URL": url,
                "BENCH_DB": str(Path(tmp) / f"{name}-{path}.sqlite3"),
                "BENCH_TASKS": "delayqueue",
            }
            if root is not None:  # the base's package first, this checkout's bench app next
                env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT)])
            self.env[path] = env
            self.clients[path] = redis.Redis.from_url(url)

    def child(self, path: str, command: list[str], quiet: bool = False) -> Child:
        return Child(command, self.env[path], quiet=quiet, cwd=self.root)

    def migrate(self, timeout: float) -> None:
        for path in PATHS:
            self.child(path, ["-m", "django", "migrate", "-v", "0"]).wait(timeout)

    def produce(self, path: str, count: int, spread: float, lead: float, timeout: float) -> float:
        """Enqueue ``count`` messages in a producer process; its rate (messages/s)."""
        command = ["-m", "bench.djapp.enqueue", path, str(count), str(spread), str(lead)]
        out, _ = self.child(path, command).wait(timeout)
        return count / (json.loads(out.strip().splitlines()[-1])["elapsed_ns"] / 1e9)

    def consumer(self, path: str, count: int) -> Child:
        command = ["-m", "django", "runqueue", QUEUES[path], "--max-messages", str(count)]
        return self.child(path, [*command, "-v", "0"], quiet=True)


def delivery(tree: Tree, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One delivery run of ``path`` on ``tree``: its figures (see the module's docstring)."""
    client = tree.clients[path]
    commands = CommandCount(client)
    commands.reset()
    enqueue_rate = tree.produce(path, args.count, 0.0, 0.0, args.timeout)
    enqueue_commands = commands.taken()
    commands.reset()
    load = os.getloadavg()[0]
    cpu_before = _children_cpu()
    consumer = tree.consumer(path, args.count)
    try:
        wait_for_done(f"{tree.name} {path}", client, consumer, args.timeout, commands)
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    delivery_commands = commands.taken()
    cpu = _children_cpu() - cpu_before
    first, done = float(client.get(FIRST)), float(client.get(DONE))
    client.flushdb()
    return {
        "enqueue_per_s": enqueue_rate,
        "delivery_per_s": args.count / (done - first) if done > first else 0.0,
        "commands_per_message": (enqueue_commands + delivery_commands) / args.count,
        "enqueue_commands_per_message": enqueue_commands / args.count,
        "delivery_commands_per_message": delivery_commands / args.count,
        "consumer_cpu_us_per_message": cpu * 1e6 / args.count,
        "load": max(load, os.getloadavg()[0]),
    }


def start_cpu(tree: Tree, path: str, args: argparse.Namespace) -> float:
    """CPU seconds of a consumer that starts, delivers one message and stops: what each
    delivery run's consumer CPU includes besides its messages (Django's start, runqueue's)."""
    client = tree.clients[path]
    tree.produce(path, 1, 0.0, 0.0, args.timeout)
    before = _children_cpu()
    consumer = tree.consumer(path, 1)
    try:
        wait_for_done(f"{tree.name} {path}", client, consumer, args.timeout)
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    client.flushdb()
    return _children_cpu() - before


def lateness(tree: Tree, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--timed`` messages due at ``--rate``/s through a listening consumer: start minus due."""
    client = tree.clients[path]
    consumer = tree.consumer(path, args.timed)
    try:
        channel = Queue(client, QUEUES[path]).keys.wake_channel
        if not wait_until(lambda: client.pubsub_numsub(channel)[0][1] > 0, 60):
            raise RuntimeError(f"{tree.name} {path}: runqueue did not listen within 60 s")
        spread = args.timed / args.rate
        tree.produce(path, args.timed, spread, 2.0, args.timeout)  # the first due in 2 s
        wait_for_done(f"{tree.name} {path}", client, consumer, args.timeout + spread)
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    late = collected_lateness(client, args.timed, f"{tree.name} {path}")
    return {
        "p50_ms": statistics.median(late),
        "p99_ms": late[min(len(late) - 1, int(len(late) * 0.99))],
        "early": sum(1 for v in late if v < 0),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    base = PackageAt(args.base)
    ours = PackageAt(args.ours) if args.ours else None
    for ref, package in ((args.base, base), (args.ours, ours)):
        if package is not None and package.root is None:
            print(f"cannot read {ref} (git archive): nothing to compare", file=sys.stderr)
            return 2
    runs: dict[str, list[dict[str, Any]]] = {}
    late: dict[str, dict[str, Any]] = {}
    starts: dict[str, float] = {}
    load_start = os.getloadavg()
    try:
        with RedisServerProcess() as server, tempfile.TemporaryDirectory(prefix="dq-ab-") as tmp:
            trees = [
                Tree("ours", ours.root if ours else None, server.url, tmp, 1),
                Tree("base", base.root, server.url, tmp, 1 + len(PATHS)),
            ]
            for tree in trees:
                tree.migrate(args.timeout)
            pairs = [(tree, path) for tree in trees for path in PATHS]
            for tree, path in pairs:
                log(f"{tree.name} {path}: a consumer's start ...")
                starts[f"{tree.name}.{path}"] = start_cpu(tree, path, args)
            for r in range(args.runs):
                for tree, path in pairs if r % 2 == 0 else reversed(pairs):
                    log(f"round {r + 1} of {args.runs}: {tree.name} {path}, {args.count} ...")
                    run = delivery(tree, path, args)
                    # Its messages' own CPU: the consumer's, less what its start costs.
                    start_us = starts[f"{tree.name}.{path}"] * 1e6
                    run["consumer_cpu_us_per_message_less_start"] = max(
                        0.0, run["consumer_cpu_us_per_message"] - start_us / args.count
                    )
                    runs.setdefault(f"{tree.name}.{path}", []).append(run)
            if args.timed:
                for tree, path in pairs:
                    log(f"{tree.name} {path}: {args.timed} due at {args.rate:g}/s ...")
                    late[f"{tree.name}.{path}"] = lateness(tree, path, args)
    finally:
        base.close()
        if ours is not None:
            ours.close()
    out = {**sides(args), **summary(runs, late, args, load_start)}
    out["consumer_start_cpu_s"] = starts
    print_report(out)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    log(f"JSON: {args.json}")
    return 0


def sides(args: argparse.Namespace) -> dict[str, Any]:
    """What each side was: its ref as given, and the commit it named (``git rev-parse``: a ref
    such as HEAD or main moves, so the ref alone does not say what was measured). This
    checkout's side is its HEAD, with whether its package's files differed from it."""
    out: dict[str, Any] = {"base": args.base, "base_commit": commit_of(args.base)}
    if args.ours:
        out.update(ours=args.ours, ours_commit=commit_of(args.ours))
    else:
        out.update(
            ours="this checkout",
            ours_commit=commit_of("HEAD"),
            ours_edited=checkout_differs(),
        )
    return out


def summary(
    runs: dict[str, list[dict[str, Any]]],
    late: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    load_start: tuple[float, float, float],
) -> dict[str, Any]:
    medians = {
        key: {name: statistics.median(r[name] for r in rs) for name in rs[0]}
        for key, rs in runs.items()
    }
    ratios = {
        tree: statistics.median(
            t["delivery_per_s"] / s["delivery_per_s"] if s["delivery_per_s"] else 0.0
            for t, s in zip(runs[f"{tree}.tasks"], runs[f"{tree}.signal"], strict=True)
        )
        for tree in TREES
    }
    cpu = "consumer_cpu_us_per_message_less_start"
    cpu_ratios = {
        tree: statistics.median(
            s[cpu] / t[cpu] if t[cpu] else 0.0
            for t, s in zip(runs[f"{tree}.tasks"], runs[f"{tree}.signal"], strict=True)
        )
        for tree in TREES
    }
    loads = [r["load"] for rs in runs.values() for r in rs]
    return {
        "count": args.count,
        "runs": args.runs,
        "timed": args.timed,
        "rate": args.rate,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_1min": {"min": min(loads), "max": max(loads)},
        "load_at_start": list(load_start),
        "medians": medians,
        "lateness": late,
        "tasks_signal_delivery_ratio": ratios,
        # The same comparison by the consumer's CPU per message (start left out): signal's
        # over tasks', so that it reads as the rate ratio would on an idle host.
        "tasks_signal_cpu_ratio": cpu_ratios,
        "ratio_target": RATIO_TARGET,
        "rounds": runs,
    }


ROWS = (
    ("delivery/s", "delivery_per_s", "{:,.0f}"),
    ("enqueue/s", "enqueue_per_s", "{:,.0f}"),
    ("consumer CPU us/msg", "consumer_cpu_us_per_message", "{:.0f}"),
    ("  less its start", "consumer_cpu_us_per_message_less_start", "{:.0f}"),
    ("Redis commands/msg", "commands_per_message", "{:.1f}"),
    ("  of which enqueue", "enqueue_commands_per_message", "{:.1f}"),
    ("  of which delivery", "delivery_commands_per_message", "{:.1f}"),
)


def side(out: dict[str, Any], name: str) -> str:
    """A side as the report names it: its ref, and the commit it named."""
    commit = out.get(f"{name}_commit")
    return f"{out[name]} ({commit[:10]})" if commit else str(out[name])


def print_report(out: dict[str, Any]) -> None:
    m, late = out["medians"], out["lateness"]
    print(
        f"{out['count']:,} no-op messages due at once, median of {out['runs']} interleaved "
        f"rounds; ours = {side(out, 'ours')}, base = {side(out, 'base')}; load average "
        f"(1 min) during the runs {out['load_1min']['min']:.2f}-{out['load_1min']['max']:.2f} on "
        f"{out['cpus']} CPUs"
    )
    print("{:<22} {:>7} {:>10} {:>10} {:>8}".format("figure", "path", "ours", "base", "ours/base"))
    for label, name, fmt in ROWS:
        for path in PATHS:
            ours, base = m[f"ours.{path}"][name], m[f"base.{path}"][name]
            ratio = f"{ours / base:.2f}x" if base else "-"
            row = (label, path, fmt.format(ours), fmt.format(base), ratio)
            print("{:<22} {:>7} {:>10} {:>10} {:>8}".format(*row))
    if late:
        for path in PATHS:
            for name, key in (("lateness p50 ms", "p50_ms"), ("lateness p99 ms", "p99_ms")):
                ours, base = late[f"ours.{path}"][key], late[f"base.{path}"][key]
                row = (name, path, f"{ours:.2f}", f"{base:.2f}", "")
                print("{:<22} {:>7} {:>10} {:>10} {:>8}".format(*row))
            early = (late[f"ours.{path}"]["early"], late[f"base.{path}"]["early"])
            print("{:<22} {:>7} {:>10} {:>10}".format("started early", path, *early))
    ratios = out["tasks_signal_delivery_ratio"]
    verdict = "met" if ratios["ours"] >= out["ratio_target"] else "MISSED"
    print(
        f"tasks / signal delivery (median of per-round ratios): ours {ratios['ours']:.2f}x, "
        f"base {ratios['base']:.2f}x; target >= {out['ratio_target']}x: {verdict}"
    )
    cpu = out["tasks_signal_cpu_ratio"]
    print(
        "the same by consumer CPU per message, its start left out (signal's / tasks', "
        f"steadier on a loaded host): ours {cpu['ours']:.2f}x, base {cpu['base']:.2f}x"
    )


def log(text: str) -> None:
    print(f"[cost_ab] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
