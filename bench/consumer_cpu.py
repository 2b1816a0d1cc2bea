"""A ``runqueue`` burst in process: its CPU, its wall time and Redis's CPU per message (issue 37).

    python -m bench.consumer_cpu tasks|signal [--count 20000] [--knockout bare|unwritten]
        [--profile FILE] [--gc-stats] [--commands] [--split]

Starts a redis-server of its own, migrates and enqueues ``--count`` no-op messages of the path
in child processes (``bench.djapp.enqueue``, due at once, as ``bench.cost_ab`` sends them),
then runs ``runqueue --max-messages N`` in this process and prints, per message: this
process's CPU around it (Django's start left out, runqueue's included), its wall time, Redis's
CPU (``INFO cpu``) and the commands Redis ran (``INFO commandstats``, those inside scripts
included). On a shared host compare the smallest of several runs, alternating the trees (run
it from another tree's directory for its package: it imports from the current directory).

``--knockout`` takes parts of a task's run away, to see what they cost the whole consumer:
``bare`` calls the task's function alone (no record, no signals, no result write), and
``unwritten`` runs it whole but leaves its result write unsent (its WritesWithAck dropped).
``--profile`` keeps a cProfile of the burst; ``--commands`` prints Redis's time per command
a message (a script's EVALSHA includes the commands it runs, which are also listed alone).
``--split`` prints the CPU of each of the consumer's two threads a message (the loop's rounds:
its round trip, the claims' decoding, the replies and each success's ``then``; the handler
thread's deliveries) and how long the handler thread waited for its next message: with one
handler thread the two share the GIL, so a handler thread that waits longer than it runs says
that the loop is the pipeline's slower stage, and Redis's time in each round trip is not
overlapped by a handler's (wall time = the process's CPU + Redis's).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis

from django_delayqueue.embedded import RedisServerProcess


def knock_out(kind: str) -> None:
    from django_delayqueue.tasks import runner

    if kind == "bare":
        from .djapp.tasks import noop

        def bare(self: Any, message: Any, queue: Any, *, atomic: str | None = None) -> None:
            noop.func(*message.payload["args"])

        runner.TaskRunner.run = bare  # type: ignore[method-assign]
    elif kind == "unwritten":
        whole = runner.TaskRunner.run

        def unwritten(self: Any, message: Any, queue: Any, *, atomic: str | None = None) -> None:
            whole(self, message, queue, atomic=atomic)

        runner.TaskRunner.run = unwritten  # type: ignore[method-assign]


class ThreadSplit:
    """--split: thread CPU of the loop's parts and of the handler thread, a message."""

    RECORDING = "core.consumer.rounds.recording"
    PARTS = (
        ("core.consumer.loop", "Consumer", "step", "loop: a round, all of it"),
        ("core.consumer.rounds.round_trip", "RoundTrip", "run", "loop:  its round trip"),
        (RECORDING, "UnrecordedOutcomes", "add_to", "loop:   outcomes packed"),
        ("core.scripts.calls", "ScriptBatch", "run", "loop:   the pipeline sent and read"),
        ("core.delivery", "Delivery", "claimed", "loop:   claims decoded"),
        (RECORDING, "UnrecordedOutcomes", "read", "loop:   replies read"),
        (RECORDING, "UnrecordedOutcomes", "_written", "loop:    writes' then()"),
        ("core.consumer.delivery", "HandlerDelivery", "deliver", "handler thread: deliveries"),
    )

    def __init__(self) -> None:
        import importlib

        self.cpu: dict[str, float] = {}
        self.waited = 0.0
        for module, cls_name, name, label in self.PARTS:
            cls = getattr(importlib.import_module(f"django_delayqueue.{module}"), cls_name)
            setattr(cls, name, self._timed(getattr(cls, name), label))
        from django_delayqueue.core.consumer.handlers.threads import HandlerThreads

        taking = HandlerThreads._next

        def next_message(threads: Any, me: Any, ident: int) -> Any:
            started = time.perf_counter()
            try:
                return taking(threads, me, ident)
            finally:
                self.waited += time.perf_counter() - started

        HandlerThreads._next = next_message  # type: ignore[method-assign,assignment]

    def _timed(self, method: Any, label: str) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.cpu[label] = self.cpu.get(label, 0.0) + time.thread_time() - started

        return timed

    def print(self, n: int) -> None:
        for _, _, _, label in self.PARTS:
            print(f"  {label}: {self.cpu.get(label, 0.0) / n * 1e6:.1f} us of its thread's CPU")
        print(f"  handler thread: waited {self.waited / n * 1e6:.1f} us for its next message")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.consumer_cpu", description=__doc__)
    p.add_argument("path", choices=("tasks", "signal"))
    p.add_argument("--count", type=int, default=20000)
    p.add_argument("--knockout", choices=("bare", "unwritten"))
    p.add_argument("--profile")
    p.add_argument("--gc-stats", action="store_true", help="print the collections it made")
    p.add_argument(
        "--commands", action="store_true", help="print Redis's time per command and message"
    )
    p.add_argument(
        "--split", action="store_true", help="print the loop's and the handler thread's CPU"
    )
    args = p.parse_args(argv)
    n = args.count
    with RedisServerProcess() as server, tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
            "BENCH_REDIS_URL": server.url,
            "BENCH_DB": os.path.join(tmp, "db.sqlite3"),
            "BENCH_TASKS": "delayqueue",
        }
        run = [sys.executable, "-m"]
        subprocess.run([*run, "django", "migrate", "-v", "0"], env=env, check=True)
        enqueue = [*run, "bench.djapp.enqueue", args.path, str(n), "0", "0"]
        subprocess.run(enqueue, env=env, check=True, stdout=subprocess.DEVNULL)
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command

        from .djapp.settings import SIGNAL_QUEUE, TASK_QUEUE
        from .djapp.timing import DONE

        if args.knockout:
            knock_out(args.knockout)
        split = ThreadSplit() if args.split else None
        client = redis.Redis.from_url(server.url)
        client.config_resetstat()

        def redis_cpu() -> float:
            info = client.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        profile = None
        if args.profile:
            import cProfile

            profile = cProfile.Profile()
        queue = TASK_QUEUE if args.path == "tasks" else SIGNAL_QUEUE
        import gc

        collections = [s["collections"] for s in gc.get_stats()]
        gc_time = [0.0, 0.0, 0.0]
        gc_started = [0.0]

        def timed(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                gc_started[0] = time.perf_counter()
            else:
                gc_time[info["generation"]] += time.perf_counter() - gc_started[0]

        if args.gc_stats:
            gc.callbacks.append(timed)
        redis_before = redis_cpu()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu, wall = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        call_command("runqueue", queue, "--max-messages", str(n), "-v", "0")
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_SELF)
        done = [(s["collections"], c) for s, c in zip(gc.get_stats(), collections, strict=True)]
        collections = [a - b for a, b in done]
        system = after.ru_stime - usage.ru_stime
        switches = (after.ru_nvcsw - usage.ru_nvcsw) + (after.ru_nivcsw - usage.ru_nivcsw)
        redis_used = redis_cpu() - redis_before
        stats = client.info("commandstats")
        commands = sum(s["calls"] for s in stats.values())
        if client.get(DONE) is None:
            raise RuntimeError("the burst ended before its last message ran")
        if profile is not None:
            profile.dump_stats(args.profile)
    print(
        f"{args.path}{f' ({args.knockout})' if args.knockout else ''}: per message "
        f"{cpu / n * 1e6:.1f} us of CPU ({system / n * 1e6:.1f} in the kernel, "
        f"{switches / n:.2f} context switches), {wall / n * 1e6:.1f} us of wall time, "
        f"{redis_used / n * 1e6:.1f} us of Redis CPU, {commands / n:.2f} Redis commands"
    )
    if args.commands:
        for name, s in sorted(stats.items(), key=lambda kv: -kv[1]["usec"]):
            print(
                f"  {name.removeprefix('cmdstat_')}: {s['calls'] / n:.3f} calls, "
                f"{s['usec'] / n:.2f} us a message ({s['usec_per_call']:.2f} us a call)"
            )
    if split is not None:
        split.print(n)
    if args.gc_stats:
        spent = ", ".join(f"{t / n * 1e6:.2f}" for t in gc_time)
        print(f"  garbage collections by generation: {collections}, us a message: {spent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
