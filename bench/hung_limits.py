"""A hung handler (``time_limit: 2``) beside a fast queue, in one real ``runqueue`` (issue 26).

    python -m bench.hung_limits            # two phases of 8 s
    python -m bench.hung_limits --quick    # a smoke run

One ``manage.py runqueue bench-hung bench-fast`` (bench.djapp.settings): ``bench-hung`` has one
thread, ``time_limit`` 2 s, and a handler that blocks in a socket read with no timeout (as an SMS
gateway call without one): only replacing its process stops it. ``bench-fast`` gets messages
due at a steady rate, each noting how late it started. Two phases, each in the same run:

- **baseline**: the fast queue alone (the hung queue idle): lateness p50, p99, early starts;
- **hung**: the same, while the hung queue's first message hangs and a second one waits
  behind it: the fast queue's lateness (target p99 within 5 ms), and when the hung queue's next
  message starts after the first one's time limit (target within ``time_limit`` + 1 s).

The hung handler cannot be stopped in its thread, so its process must be replaced. With a
``runqueue --processes`` (the supervisor) the bench runs under it; without one, the bench plays
the supervisor's part the crudest way: when ``runqueue`` exits (it stops as on SIGTERM once it
has asked for a replacement), the bench starts a new one at once, and reports that restart
(a supervisor replaces the process without the bench's help, and without a fresh Django start
on the critical path).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess

from .djapp.limits import FAST_LATENESS, HUNG_STARTS
from .djapp.settings import FAST_QUEUE, HUNG_QUEUE
from .harness import ROOT, Child, percentile, wait_until

TIME_LIMIT = 2.0  # bench-hung's time_limit (bench/djapp/settings.py)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.hung_limits", description=__doc__)
    p.add_argument("--quick", action="store_true", help="short phases: a smoke run")
    p.add_argument("--seconds", type=float, default=None, help="length of each phase")
    p.add_argument("--rate", type=float, default=200.0, help="fast messages per second")
    return p.parse_args(argv)


def supervised() -> bool:
    """Whether this runqueue has a supervisor (``--processes``)."""
    out = subprocess.run(
        [sys.executable, "-m", "django", "runqueue", "--help"],
        cwd=ROOT,
        env=_env_base(),
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "--processes" in out


def _env_base() -> dict[str, str]:
    import os

    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.djapp.settings", "PYTHONPATH": path}


class Consumers:
    """``runqueue`` for both queues; restarted at once when it exits (no supervisor)."""

    def __init__(self, env: dict[str, str], with_supervisor: bool) -> None:
        self.env = env
        self.args = ["-m", "django", "runqueue", HUNG_QUEUE, FAST_QUEUE, "-v", "1"]
        if with_supervisor:
            self.args += ["--processes", "1"]
        self.with_supervisor = with_supervisor
        self.exits: list[tuple[float, int]] = []  # when runqueue exited on its own, its code
        self.child = Child(self.args, env, quiet=True)

    def keep_running(self) -> None:
        code = self.child.proc.poll()
        if code is not None:
            self.exits.append((time.time(), code))
            self.child = Child(self.args, self.env, quiet=True)

    def stop(self) -> None:
        if self.child.proc.poll() is None:
            self.child.proc.terminate()
            try:
                self.child.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.child.proc.kill()


def run_phase(
    client: redis.Redis, consumers: Consumers, seconds: float, rate: float, hang: bool
) -> dict[str, Any]:
    fast, hung = Queue(client, FAST_QUEUE), Queue(client, HUNG_QUEUE)
    client.delete(FAST_LATENESS, HUNG_STARTS)
    rng = random.Random(7)
    start = fast.clock.now_ms() + 500
    count = int(seconds * rate)
    dues = sorted(start + rng.randrange(int(seconds * 1000)) for _ in range(count))
    fast.schedule_many([{"payload": {"n": i}, "at": d} for i, d in enumerate(dues)])
    if hang:
        hung.schedule({"hang": True}, id="hangs", at=start)
        hung.schedule({"hang": False}, id="next", at=start + 100)
    end = time.time() + (start - fast.clock.now_ms()) / 1000 + seconds + 1
    while time.time() < end:
        consumers.keep_running()
        time.sleep(0.01)
    wait_until(lambda: client.llen(FAST_LATENESS) >= count, 30)
    if hang:  # the next message starts once the hung one's process was replaced

        def next_started() -> bool:
            consumers.keep_running()
            return client.llen(HUNG_STARTS) >= 2

        wait_until(next_started, 30)
    late = [float(x) for x in client.lrange(FAST_LATENESS, 0, -1)]
    starts = {n["id"]: n for n in map(json.loads, client.lrange(HUNG_STARTS, 0, -1))}
    out: dict[str, Any] = {
        "fast_messages": count,
        "fast_started": len(late),
        "p50_ms": percentile(late, 50) if late else None,
        "p99_ms": percentile(late, 99) if late else None,
        "max_ms": max(late) if late else None,
        "early": sum(1 for x in late if x < 0),
    }
    if hang:
        first, nxt = starts.get("hangs"), starts.get("next")
        if first and nxt:
            out["next_after_limit_s"] = nxt["started"] - (first["started"] + TIME_LIMIT)
            out["next_in_another_process"] = nxt["pid"] != first["pid"]
        out["runqueue_exits"] = [code for _, code in consumers.exits]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    with_supervisor = supervised()
    with RedisServerProcess() as server, tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        client = redis.Redis.from_url(server.url)
        env = {"BENCH_REDIS_URL": server.url, "BENCH_DB": str(Path(tmp) / "bench.sqlite3")}
        Child(["-m", "django", "migrate", "-v", "0"], {**env, **_settings()}).wait(120)
        consumers = Consumers({**env, **_settings()}, with_supervisor)
        try:
            channel = Queue(client, FAST_QUEUE).keys.wake_channel
            if not wait_until(lambda: client.pubsub_numsub(channel)[0][1] > 0, 60):
                raise RuntimeError("runqueue did not start listening within 60 s")
            baseline = run_phase(client, consumers, seconds, args.rate, hang=False)
            hung = run_phase(client, consumers, seconds, args.rate, hang=True)
        finally:
            consumers.stop()
    report(baseline, hung, with_supervisor, seconds, args.rate)
    return 0


def _settings() -> dict[str, str]:
    return {"DJANGO_SETTINGS_MODULE": "bench.djapp.settings"}


def report(
    baseline: dict[str, Any],
    hung: dict[str, Any],
    with_supervisor: bool,
    seconds: float,
    rate: float,
) -> None:
    how = "runqueue --processes 1" if with_supervisor else "runqueue, restarted by the bench"
    print(f"hung handler (time_limit {TIME_LIMIT:g} s) beside a fast queue; {how}")
    print(f"fast queue: {rate:g} messages/s over {seconds:g} s per phase\n")
    for name, r in (("baseline (fast alone)", baseline), ("beside the hung handler", hung)):
        print(
            f"  {name:26} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:8.2f} ms  "
            f"max {r['max_ms']:8.2f} ms  early {r['early']}  "
            f"({r['fast_started']}/{r['fast_messages']} started)"
        )
    nxt = hung.get("next_after_limit_s")
    target = "ok" if nxt is not None and nxt <= 1.0 else "MISSED"
    p99_target = "ok" if (hung["p99_ms"] or 1e9) <= 5.0 else "MISSED"
    print(f"\n  fast p99 beside the hung handler: target <= 5 ms: {p99_target}")
    if nxt is None:
        print("  the hung queue's next message did not start")
    else:
        print(
            f"  hung queue's next message started {nxt:.2f} s after the time limit "
            f"(target <= 1 s: {target}); in another process: {hung['next_in_another_process']}"
        )
    print(f"  runqueue exits (restarted by the bench): {hung.get('runqueue_exits')}")
    print(json.dumps({"baseline": baseline, "hung": hung, "supervised": with_supervisor}))


if __name__ == "__main__":
    sys.exit(main())
