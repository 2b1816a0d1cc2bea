"""What every benchmark section shares: the private Redis, timing, rows, Redis statistics.

The machine is shared and noisy, so a figure is only meaningful next to a raw-Redis baseline
measured at the same moment: :func:`interleave` runs our workload and its baseline in
alternating short rounds and reports the median of the per-round ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.loader import script_names
from django_delayqueue.embedded import RedisServerProcess

ROOT = Path(__file__).resolve().parent.parent

# A 100-byte JSON payload, the size the memory target is stated for.
PAYLOAD_100: dict[str, Any] = {"order": 42, "store": 7, "note": "x" * 68}
assert len(json.dumps(PAYLOAD_100, separators=(",", ":"))) == 100


@dataclass
class Row:
    """One line of the report: our figure, its baseline, and the target it is held to."""

    key: str  # stable id, used by the JSON and the smoke test
    what: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_what: str = ""
    ratio: float | None = None  # value / baseline (median of per-round ratios when interleaved)
    target: str = ""
    ok: bool | None = None  # None: reported only, no target
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def at_least(ratio: float | None, minimum: float) -> bool | None:
    return None if ratio is None else ratio >= minimum


def at_most(value: float | None, maximum: float) -> bool | None:
    return None if value is None else value <= maximum


# --- timing -----------------------------------------------------------------------------------


def now_ns() -> int:
    return time.perf_counter_ns()


def rate(count: int, elapsed_ns: int) -> float:
    return count / (elapsed_ns / 1e9) if elapsed_ns > 0 else float("inf")


def timed(work: Callable[[], int]) -> float:
    """Run ``work`` (which returns how many operations it did) and return operations/s."""
    start = now_ns()
    count = work()
    return rate(count, now_ns() - start)


@dataclass
class Interleaved:
    rates: list[float]  # median rate of each workload, in the order given
    ratio: float  # median over rounds of rate[0] / rate[1]
    rounds: list[list[float]]


def interleave(rounds: int, *workloads: Callable[[int], int]) -> Interleaved:
    """Run the workloads in turn, ``rounds`` times; each takes a round number, returns a count.

    The first two are compared: the ratio is the median of the per-round ratios, so a burst
    of load from a neighbour hits both sides of one comparison rather than only one of them.
    Every other round runs the workloads in reverse order, so that neither side always runs
    first (on a warmer or a colder machine).
    """
    per_round: list[list[float]] = []
    for i in range(rounds):
        order = range(len(workloads)) if i % 2 == 0 else range(len(workloads) - 1, -1, -1)
        rates = {j: timed(lambda j=j, i=i: workloads[j](i)) for j in order}
        per_round.append([rates[j] for j in range(len(workloads))])
    rates = [statistics.median(r[j] for r in per_round) for j in range(len(workloads))]
    ratio = statistics.median(r[0] / r[1] for r in per_round) if len(workloads) > 1 else 1.0
    return Interleaved(rates, ratio, per_round)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


# --- Redis --------------------------------------------------------------------------------------


class Bench:
    """The run's private redis-server and the helpers that read its statistics."""

    def __init__(self, server: RedisServerProcess) -> None:
        self.server = server
        self.url = server.url
        self.client = redis.Redis.from_url(self.url)

    def new_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def flush(self) -> None:
        # Its own client: emptying millions of keys outlasts redis-py's default socket timeout.
        client = redis.Redis.from_url(self.url, socket_timeout=600)
        try:
            self.server.flushall(client)
        finally:
            client.close()

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def command_calls(self) -> dict[str, int]:
        """Calls per command so far (``INFO commandstats``; includes calls made by scripts)."""
        stats = self.client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    @contextmanager
    def slowlog(
        self, threshold_us: int = 1000, max_len: int = 100_000
    ) -> Iterator[list[tuple[int, str]]]:
        """Collect ``(µs, command name)`` of every command slower than ``threshold_us``.

        A script is one command to Redis, so its whole run time is one entry; it is named by
        its SHA (``claim.lua``). The list is filled when the block ends, slowest first.
        """
        slow: list[tuple[int, str]] = []
        old = self.client.config_get("slowlog-*")
        self.client.config_set("slowlog-log-slower-than", threshold_us)
        self.client.config_set("slowlog-max-len", max_len)
        self.client.slowlog_reset()
        try:
            yield slow
        finally:
            entries = self.client.slowlog_get(max_len)
            slow.extend(
                sorted(((int(e["duration"]), _command_name(e)) for e in entries), reverse=True)
            )
            for name, value in old.items():
                self.client.config_set(name, value)


def _command_name(entry: dict[str, Any]) -> str:
    """``claim.lua`` for an EVALSHA of our claim script, else the command's name."""
    words = entry["command"].split()
    name = to_str(words[0]).lower() if words else "?"
    if name == "evalsha" and len(words) > 1:
        sha = to_str(words[1])
        return next(
            (f"{s}.lua" for s in script_names() if LuaScript.named(s).sha == sha), "a script"
        )
    return name


@contextmanager
def private_redis() -> Iterator[Bench]:
    """A redis-server of our own on a free port, no persistence, stopped at the end."""
    with RedisServerProcess() as server:
        yield Bench(server)


# --- child processes --------------------------------------------------------------------------


class Child:
    """A Python child process (consumer, huey worker, runserver) that is always stopped."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        quiet: bool = False,
        cwd: Path | None = None,
    ) -> None:
        """``quiet``: its standard output is dropped (a chatty child would block on a full
        pipe that nobody reads until it exits). ``cwd``: another checkout to run (a base
        commit's files), instead of this one."""
        root = ROOT if cwd is None else cwd
        path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        self.what = " ".join(args[:2])
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=root,
            env=full_env,
            stdout=subprocess.DEVNULL if quiet else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait(self, timeout: float) -> tuple[str, str]:
        """Wait for the child to exit on its own; kill it (our PID only) after ``timeout``."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise RuntimeError(
                f"{self.what} did not finish in {timeout}s:\n{err[-2000:]}"
            ) from None
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.what} exited {self.proc.returncode}:\n{err[-2000:]}")
        return out, err

    def stop(self, timeout: float = 10.0) -> tuple[str, str]:
        """Ask the child to stop (SIGTERM) and collect its output."""
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
