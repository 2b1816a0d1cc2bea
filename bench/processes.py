"""``runqueue --processes``: a supervised consumer beside runqueue in one process, and CPU work
spread over processes.

    python -m bench --only processes,processes_cpu
    python -m bench.processes [--quick]          # the same two sections alone

Both on ``bench.djapp.settings``, every consumer a real ``manage.py runqueue``:

- ``processes``: delivery (N messages due at once: first start to last finish) and lateness
  (messages due at a steady rate: start minus due, p50/p99, early) of ``runqueue --processes 1``
  (a supervisor and one consumer process, the default now) beside ``runqueue --max-messages N``,
  which still runs the consumer in the command's own process, as every ``runqueue`` did before
  supervisors; interleaved rounds, the median of the per-round ratios.
- ``processes_cpu``: a handler that burns 20 ms of pure Python per message; messages/s with
  ``--processes 2`` against ``--processes 1`` (one handler thread per process), interleaved.
  Target 1.7x on two cores; on a machine shared with other jobs the ratio says how many cores
  the run really got.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django_delayqueue.core import Queue

from .djapp.cpu import COUNTED
from .djapp.settings import CPU_QUEUE, SIGNAL_QUEUE
from .djapp.timing import DONE, FIRST, LATENESS
from .harness import ROOT, Bench, Child, Row, at_least, private_redis, wait_until
from .sizes import Sizes, sizes_for

CPU_RATIO_TARGET = 1.7
DELIVERY_RATIO_TARGET = 0.9  # "no worse than today", less the noise of a shared machine
LATENESS_RATE = 500.0  # timed messages due per second


class Consumers:
    """``runqueue`` child processes of the bench project on the bench's Redis."""

    def __init__(self, bench: Bench, tmp: str, timeout: float) -> None:
        self.bench = bench
        self.timeout = timeout
        self.env = {
            "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
            "BENCH_REDIS_URL": bench.url,
            "BENCH_DB": str(Path(tmp) / "bench.sqlite3"),
        }
        Child(["-m", "django", "migrate", "-v", "0"], self.env).wait(timeout)

    def start(self, queue: str, *args: str, root: Path | None = None) -> Child:
        """``runqueue queue *args``; ``root``: the package of another checkout (a base
        commit's ``django_delayqueue``), with this checkout's bench app."""
        env = self.env
        if root is not None:
            env = {**env, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])}
        command = ["-m", "django", "runqueue", queue, "-v", "0", *args]
        return Child(command, env, quiet=True, cwd=root)

    def wait_listening(self, queue: str, child: Child, listeners: int = 1) -> None:
        """Until ``listeners`` consumer processes listen on the queue's wake channel."""
        channel = Queue(self.bench.client, queue).keys.wake_channel
        numsub = lambda: self.bench.client.pubsub_numsub(channel)[0][1]  # noqa: E731
        if not wait_until(lambda: numsub() >= listeners or child.proc.poll() is not None, 60):
            raise RuntimeError(f"runqueue {queue}: not listening within 60 s")
        if child.proc.poll() is not None:
            raise RuntimeError(f"runqueue {queue} exited {child.proc.returncode}")

    def finish(self, child: Child, supervised: bool) -> None:
        """Wait for the end mark, then for the child (a supervised one is sent SIGTERM)."""
        client = self.bench.client
        ok = wait_until(lambda: client.exists(DONE) or child.proc.poll() is not None, self.timeout)
        try:
            if not ok or not client.exists(DONE):
                raise RuntimeError(f"the last message did not run in {self.timeout}s")
            if supervised:
                child.stop(60)
            else:
                child.wait(60)
        finally:
            child.kill()


def delivery_round(c: Consumers, count: int, supervised: bool, root: Path | None = None) -> float:
    q = Queue(c.bench.client, SIGNAL_QUEUE)
    due = q.clock.now_ms() + 1000 + count // 20
    last = count - 1
    for start in range(0, count, 10_000):
        items = [
            {"payload": {"i": i, "due": due, "last": last}, "at": due}
            for i in range(start, min(count, start + 10_000))
        ]
        q.schedule_many(items)
    while q.clock.now_ms() <= due:
        time.sleep(0.005)
    args = () if supervised else ("--max-messages", str(count))
    processes = ("--processes", "1") if supervised else ()
    c.finish(c.start(SIGNAL_QUEUE, *args, *processes, root=root), supervised)
    first, done = float(c.bench.client.get(FIRST)), float(c.bench.client.get(DONE))
    c.bench.flush()
    return count / (done - first)


def lateness_run(
    c: Consumers, count: int, supervised: bool, root: Path | None = None
) -> dict[str, Any]:
    args = ("--processes", "1") if supervised else ("--max-messages", str(count))
    child = c.start(SIGNAL_QUEUE, *args, root=root)
    try:
        c.wait_listening(SIGNAL_QUEUE, child)
        q = Queue(c.bench.client, SIGNAL_QUEUE)
        spread_ms = count / LATENESS_RATE * 1000
        base = (time.time() + 2.0) * 1000  # the wall clock, as the receiver's
        dues = [float(int(base + i * spread_ms / count) + 1) for i in range(count)]
        q.schedule_many(
            [
                {"payload": {"i": i, "due": d, "last": count - 1}, "at": int(d)}
                for i, d in enumerate(dues)
            ]
        )
    except BaseException:
        child.kill()
        raise
    c.finish(child, supervised)
    late = sorted(float(v) for v in c.bench.client.lrange(LATENESS, 0, -1))
    c.bench.flush()
    if len(late) != count:
        raise RuntimeError(f"{len(late)} of {count} timed messages ran")
    return {
        "p50": statistics.median(late),
        "p99": late[min(len(late) - 1, int(len(late) * 0.99))],
        "early": sum(1 for v in late if v < 0),
    }


def supervised_beside_in_process(bench: Bench, sizes: Sizes) -> list[Row]:
    count = max(600, sizes.delivery // 5)
    rounds = 2 if sizes.delivery < 10_000 else sizes.rounds  # --quick: a smoke run
    with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        c = Consumers(bench, tmp, sizes.timeout)
        ours, base, ratios = [], [], []
        for r in range(rounds):  # alternate who goes first: drift hits both alike
            order = (True, False) if r % 2 else (False, True)
            got = {s: delivery_round(c, count, s) for s in order}
            ours.append(got[True])
            base.append(got[False])
            ratios.append(got[True] / got[False])
        timed = max(200, sizes.lateness)
        late_base = lateness_run(c, timed, supervised=False)
        late_ours = lateness_run(c, timed, supervised=True)
    ratio = statistics.median(ratios)

    def ratio_of(key: str) -> float | None:
        return late_ours[key] / late_base[key] if late_base[key] > 0 else None

    p99_bound = max(late_base["p99"] * 1.5, late_base["p99"] + 1.0)
    return [
        Row(
            "processes.delivery",
            f"runqueue --processes 1, {count:,} due at once, msg/s (median of {rounds})",
            statistics.median(ours),
            "msg/s",
            statistics.median(base),
            "runqueue in one process (--max-messages), same run",
            ratio,
            f">= {DELIVERY_RATIO_TARGET}x",
            at_least(ratio, DELIVERY_RATIO_TARGET),
        ),
        Row(
            "processes.lateness_p50",
            f"runqueue --processes 1, {timed:,} due at {LATENESS_RATE:g}/s, start - due p50",
            late_ours["p50"],
            "ms",
            late_base["p50"],
            "runqueue in one process, same run",
            ratio_of("p50"),
            target="reported",
        ),
        Row(
            "processes.lateness_p99",
            "runqueue --processes 1, start - due p99",
            late_ours["p99"],
            "ms",
            late_base["p99"],
            "runqueue in one process, same run",
            ratio_of("p99"),
            target="<= 1.5x the baseline (or +1 ms), 0 early",
            ok=late_ours["p99"] <= p99_bound and late_ours["early"] == 0,
            note=f"early: {late_ours['early']} (baseline {late_base['early']})",
        ),
    ]


def _cpu_round(c: Consumers, count: int, processes: int) -> float:
    child = c.start(CPU_QUEUE, "--processes", str(processes))
    try:
        c.wait_listening(CPU_QUEUE, child, listeners=processes)
        Queue(c.bench.client, CPU_QUEUE).schedule_many(
            [{"payload": {"count": count}} for _ in range(count)]
        )
    except BaseException:
        child.kill()
        raise
    c.finish(child, supervised=True)
    first, done = float(c.bench.client.get(FIRST)), float(c.bench.client.get(DONE))
    assert int(c.bench.client.get(COUNTED) or 0) >= count
    c.bench.flush()
    return count / (done - first)


def cpu_bound(bench: Bench, sizes: Sizes) -> list[Row]:
    quick = sizes.delivery < 10_000
    count = 100 if quick else 1000
    rounds = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        c = Consumers(bench, tmp, sizes.timeout)
        two, one, ratios = [], [], []
        for r in range(rounds):
            order = (1, 2) if r % 2 else (2, 1)
            got = {n: _cpu_round(c, count, n) for n in order}
            two.append(got[2])
            one.append(got[1])
            ratios.append(got[2] / got[1])
    ratio = statistics.median(ratios)
    return [
        Row(
            "processes.cpu",
            f"20 ms of pure Python per message, {count:,} messages, --processes 2, msg/s",
            statistics.median(two),
            "msg/s",
            statistics.median(one),
            "--processes 1, same run",
            ratio,
            f">= {CPU_RATIO_TARGET}x (2 cores; shared machine: reported)",
            at_least(ratio, CPU_RATIO_TARGET),
            extra={"rounds": ratios},
        )
    ]


def main(argv: list[str] | None = None) -> int:
    from .report import table

    sizes = sizes_for("--quick" in (argv if argv is not None else sys.argv[1:]))
    with private_redis() as bench:
        rows = supervised_beside_in_process(bench, sizes)
        bench.flush()
        rows += cpu_bound(bench, sizes)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
