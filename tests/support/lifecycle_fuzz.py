"""The lifecycle fuzzer: real ``runqueue --processes 2`` supervisors under random handlers and
random faults for a bounded time, then the verdict that no message ever ran twice at once.

Two supervisors (``runqueue --processes 2``, the drill project: tests/support/drill_settings.py
and drill_app/handlers.py) serve the thread queue "drill" and the async queue "drill-async" on
one real Redis. For :attr:`FuzzConfig.seconds` the fuzzer schedules messages whose handlers are
(:data:`HANDLER_KINDS`) quick, failing, slow, hung in ``time.sleep``, hung in a socket read,
stuck in one C call that holds the GIL for seconds (as a catastrophic regex does), spinning on
the CPU, async awaiting ``asyncio.to_thread``, or running a program (``sleep``) as
``subprocess.run`` does; and it fires (:data:`EVENT_KINDS`) ``dq.abort`` of messages in flight,
live edits of ``time_limit`` and ``visibility_timeout`` (published to Redis as the admin does),
``kill -9`` of consumer processes and of a supervisor (then a new supervisor), and ``SIGHUP``
after a good deploy and after one whose code fails to import (the code on disk is fixed some
seconds later, and the run ends with a failed deploy, so that a handler stuck then must still be
settled).
Every kind can be switched off (:func:`parse_kinds`, ``DQ_FUZZ_KINDS``).

Each handler call writes its start, its end and what it started (a thread, a program) to the
ledger (tests/support/ledger.py); a :class:`process_deaths.DeathWatch` records when every
consumer process and every program ended. A call with no end line ran until its process ended
(a process killed by the test or replaced by its supervisor runs nothing after its death); an
async call until its thread ended too; a call that ran a program until the program exited.

:meth:`Fuzz.check` then fails the test if two runs of one message overlapped, a message is
neither acknowledged nor dead-lettered with a reason, one started before it was due, or an
attempt is miscounted (attempt numbers per message strictly increasing and within
``max_attempts``; journal rows one per attempt that ran, in order; an acknowledgement on the
last attempt that ran; a dead letter that was not aborted used every attempt, and an aborted
one is journaled as such); or if a runqueue logged an internal failure or did not exit 0 on
SIGTERM. Each failure names the seed, the command that replays it (the same draws; the timing
is the machine's) and an excerpt of the ledger, the deaths and the journal of the message.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import redis
from drill import Runqueues, producer, settled
from ledger import EARLY_TOLERANCE_MS, Delivery, Part, Run, overlaps, read, read_parts, read_runs
from paths import child_pythonpath
from process_deaths import DeathWatch, children_of, wall_ms
from waiting import wait_until

from django_delayqueue.core import Queue

T = TypeVar("T")

THREADS, ASYNC = "drill", "drill-async"
QUEUES = (THREADS, ASYNC)

# Handler kinds, and how many of the messages scheduled are of each (weights).
HANDLER_KINDS: dict[str, float] = {
    "quick": 30,  # returns at once
    "fail": 6,  # raises: retried, or dead letters once its attempts run out
    "slow": 12,  # sleeps well within its time limit
    "sleep": 3,  # hung in time.sleep past its time limit: its process is replaced
    "socket": 3,  # hung in a socket read with no timeout: the same
    "gil": 1.5,  # a C call that holds the GIL for longer than the visibility timeout
    "cpu": 4,  # a Python loop on the CPU, some past the time limit (stoppable)
    "async": 10,  # async def awaiting asyncio.to_thread: quick, slow, hung or spinning
    "subprocess": 4,  # runs `sleep S`, some past the time limit
}
# Events, and the mean seconds between two of each (drawn every step).
EVENT_KINDS: dict[str, float] = {
    "abort": 1.5,  # dq.abort of a message in flight (sometimes of one that is not)
    "time_limit": 5.0,  # a live edit of a queue's time_limit
    "visibility": 5.0,  # a live edit of a queue's visibility_timeout
    "kill_child": 7.0,  # kill -9 of a consumer process
    "kill_supervisor": 25.0,  # kill -9 of a supervisor, then a new one
    "sighup": 15.0,  # a good deploy, then SIGHUP
    "sighup_broken": 30.0,  # a deploy whose code fails to import, then SIGHUP; fixed later
}
KINDS: tuple[str, ...] = (*HANDLER_KINDS, *EVENT_KINDS)
# What `make test` runs: every kind but those that still find an open defect, each named here
# with it, to run on demand (DQ_FUZZ_KINDS=all) until it is fixed. Not a skip: the kind's
# failure is the defect's reproduction.
OPEN_DEFECTS: dict[str, str] = {}
DEFAULT_KINDS = ",".join(["all", *(f"-{kind}" for kind in OPEN_DEFECTS)])
# What may outlive a time limit: none is scheduled in the last QUIET_SECONDS, so that the
# drain is short.
HANGING = frozenset({"sleep", "socket", "gil", "subprocess", "cpu", "async"})

STEP_SECONDS = 0.1  # one draw of a message and of each event per step
SCHEDULE_CHANCE = 0.5  # of a message at each step
DELAYS = (0, 0, 0, 0, 0, 0.05, 0.2, 0.5, 1, 2, 3)
SUPERVISORS, PROCESSES, GRACE = 2, 2, 5
TIME_LIMITS = (1, 1.5, 2, 3, 4)
VISIBILITY_OVER = (2, 3, 4, 6)  # visibility_timeout - time_limit (at least 2: check E014)
MAX_ATTEMPTS = 3
GIL_EVERY = 8.0  # seconds between two "gil" messages (each stops a whole process for seconds)
QUIET_SECONDS = 10.0
BROKEN_SECONDS = (5, 10, 20)  # how long a failed deploy stays on disk before it is fixed
START_SECONDS = 90.0  # bounds against hangs, never timing checks
DRAIN_SECONDS = 120.0
STOP_SECONDS = 60.0
DEATHS_SECONDS = 20.0
# Lines a runqueue logs only when something went wrong inside it (Redis is never faulted here).
ALARMS = ("consumer step failed", "handler thread failed", ".lua failed", "dropped after")

RELEASE_APPS = """\
from django.apps import AppConfig


class FuzzReleaseConfig(AppConfig):
    name = "fuzz_release"

    def ready(self):
        from . import release  # noqa: F401  (what a deploy changes)
"""
RELEASE = 'VERSION = "{version}"\n'
BROKEN_RELEASE = "this release does not import\n"
SETTINGS = """\
from drill_settings import *  # noqa: F403
from drill_settings import DELAYQUEUE, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "fuzz_release"]
# Live edits reach the consumers within half a second.
DELAYQUEUE["SETTINGS_REFRESH_SECONDS"] = 0.5
"""


@dataclass(frozen=True)
class FuzzConfig:
    """How long to fuzz, the seed of every draw, and the kinds of handlers and events on."""

    seconds: float
    seed: int
    kinds: frozenset[str]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FuzzConfig:
        """``DQ_FUZZ_SECONDS`` (default 60), ``DQ_FUZZ_SEED`` (default: a fresh one),
        ``DQ_FUZZ_KINDS`` (default :data:`DEFAULT_KINDS`: all but the :data:`OPEN_DEFECTS`;
        see :func:`parse_kinds`)."""
        raw = environ.get("DQ_FUZZ_SECONDS", "60")
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not (0 < seconds < math.inf):
            raise ValueError(f"DQ_FUZZ_SECONDS={raw!r}: give a number of seconds above 0")
        raw_seed = environ.get("DQ_FUZZ_SEED", "")
        try:
            seed = int(raw_seed) if raw_seed else random.randrange(2**32)
        except ValueError:
            raise ValueError(f"DQ_FUZZ_SEED={raw_seed!r}: give an integer") from None
        return cls(seconds, seed, parse_kinds(environ.get("DQ_FUZZ_KINDS", DEFAULT_KINDS)))

    @property
    def replay(self) -> str:
        kinds = "all" if self.kinds == frozenset(KINDS) else ",".join(sorted(self.kinds))
        return (
            f"DQ_FUZZ_SEED={self.seed} DQ_FUZZ_SECONDS={self.seconds:g} DQ_FUZZ_KINDS={kinds} "
            "python -m pytest tests/drills/test_lifecycle_fuzz.py"
        )


def parse_kinds(spec: str) -> frozenset[str]:
    """The kinds a comma-separated ``spec`` turns on: names of :data:`KINDS`, "all", and
    "-name" to leave one out ("all,-gil"; a spec of only "-name"s starts from all)."""
    words = [w.strip() for w in spec.split(",") if w.strip()]
    unknown = [w for w in words if w.lstrip("-") not in (*KINDS, "all")]
    if unknown:
        raise ValueError(
            f"DQ_FUZZ_KINDS: unknown kind(s) {', '.join(unknown)}; known: all, {', '.join(KINDS)}"
        )
    chosen: set[str] = set() if any(not w.startswith("-") for w in words) else set(KINDS)
    for word in words:
        if word == "all":
            chosen |= set(KINDS)
        elif word == "-all":
            chosen.clear()
        elif word.startswith("-"):
            chosen.discard(word[1:])
        else:
            chosen.add(word)
    return frozenset(chosen)


@dataclass
class Sent:
    """A message the fuzzer scheduled."""

    id: str
    queue: str
    kind: str
    plan: list[str]
    due_ms: int


@dataclass
class Call:
    """One handler call: its start line, its end line (if it returned or raised), the parts it
    started, and when it really ended (:meth:`Fuzz._end_calls`)."""

    start: Delivery
    run: Run | None
    parts: list[Part] = field(default_factory=list)
    end_ms: int = 0
    how: str = ""


class Fuzz:
    """One fuzzing run (see the module doc): :meth:`run` drives it to the end (drained and
    stopped), :meth:`check` gives the verdict, :meth:`close` cleans up whatever happened."""

    def __init__(self, url: str, client: redis.Redis, workdir: Path, config: FuzzConfig) -> None:
        self.url = url
        self.client = client
        self.workdir = workdir
        self.config = config
        self.kinds = config.kinds
        self.rng = random.Random(config.seed)
        r = self.rng
        self.settings: dict[str, dict[str, Any]] = {}
        for name in QUEUES:
            limit = r.choice([1.5, 2, 3])
            self.settings[name] = {
                "time_limit": limit,
                "visibility_timeout": limit + r.choice(VISIBILITY_OVER),
                "max_attempts": MAX_ATTEMPTS,
                "backoff_base": 0.05,
                "backoff_max": 0.5,
                "concurrency": 2,
                "claim_batch": r.choice([1, 2, 4]),
                "abort_grace_seconds": r.choice([0.5, 1, 2]),
            }
        # What the consumers follow now (the file settings, then each published edit).
        self.current = {
            name: {k: s[k] for k in ("time_limit", "visibility_timeout")}
            for name, s in self.settings.items()
        }
        self.code = workdir / "code"
        self.version = 1
        self._deploy(broken=False)
        env = {
            "DJANGO_SETTINGS_MODULE": "fuzz_settings",
            "PYTHONPATH": child_pythonpath(self.code),
            # A rewritten module of the same size in the same second: no stale .pyc for it.
            "PYTHONDONTWRITEBYTECODE": "1",
            "DRILL_QUEUES": json.dumps(self.settings),
        }
        self.runqueues = Runqueues(url, workdir, env)
        self.queues: dict[str, Queue] = {name: producer(url, name) for name in QUEUES}
        self.supervisors: list[subprocess.Popen[bytes]] = []  # the live ones
        self._supervisor_pids: tuple[int, ...] = ()  # read by the death watch's thread
        self.deaths = DeathWatch(lambda: self._supervisor_pids, self.runqueues.ledger)
        self.sent: dict[str, Sent] = {}
        self.aborted: dict[str, int] = {}  # id -> wall ms of the abort that took
        self.killed: dict[int, int] = {}  # pid -> wall ms of the test's kill -9
        self.exit_codes: dict[int, int | None] = {}  # supervisor pid -> code after SIGTERM
        self.stopped: list[subprocess.Popen[bytes]] = []  # the supervisors SIGTERM stopped
        self.actions: list[str] = []
        self.problems: list[str] = []
        self.broken_until: float | None = None  # time.monotonic() when the code is fixed
        self.tally: Counter[str] = Counter()
        self.last_gil = -math.inf
        self.t0_ms = wall_ms()
        self.t0 = time.monotonic()

    # --- what a failure says ------------------------------------------------------------------

    @property
    def fail(self) -> str:
        return (
            f"lifecycle fuzz, seed {self.config.seed} (replay: {self.config.replay}); ledger, "
            f"runqueue logs, actions.log and report.txt in {self.workdir}"
        )

    def describe(self) -> str:
        kinds = sorted(self.kinds)
        return (
            f"{self.fail}\n{self.config.seconds:g} s; kinds {kinds}; queue settings {self.settings}"
        )

    def _rel(self, ms: int | None) -> str:
        return "?" if ms is None else f"+{(ms - self.t0_ms) / 1000:.3f}s"

    def _act(self, text: str) -> None:
        self.actions.append(f"{self._rel(wall_ms()):>10} {text}")

    def close(self) -> None:
        """Kill what is still running (only processes this test started, or that its
        runqueues started: by pid), and keep the test's actions next to the logs."""
        self.runqueues.close()
        self.deaths.stop()
        for pid in sorted(self.deaths.seen_ms):
            if self.deaths.ended_ms.get(pid) is None and _is_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        (self.workdir / "actions.log").write_text("\n".join(self.actions) + "\n")

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> None:
        for _ in range(SUPERVISORS):
            self._start_supervisor()
        for sup in self.supervisors:
            self.runqueues.consuming_children(sup, PROCESSES)
        self.deaths.start()
        self.t0_ms, self.t0 = wall_ms(), time.monotonic()
        self._act(f"start: {self.describe()}")
        steps = int(self.config.seconds / STEP_SECONDS)
        for step in range(steps):
            planned = self.t0 + step * STEP_SECONDS
            pause = planned - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            elapsed = step * STEP_SECONDS
            if self.broken_until is not None and time.monotonic() >= self.broken_until:
                self._fix_deploy()
            if self.rng.random() < SCHEDULE_CHANCE:
                self._schedule(elapsed)
            for name, mean in EVENT_KINDS.items():
                if self.rng.random() < STEP_SECONDS / mean and name in self.kinds:
                    getattr(self, f"_{name}")()
        if self.broken_until is not None:
            self._fix_deploy()
        if "sighup_broken" in self.kinds:
            self._end_with_a_failed_deploy()
        self._drain()
        self._stop()

    def _start_supervisor(self) -> None:
        sup = self.runqueues.start(
            "--processes", str(PROCESSES), "--grace", str(GRACE), queues=list(QUEUES)
        )
        self.supervisors.append(sup)
        self._supervisor_pids = tuple(s.pid for s in self.supervisors)
        self._act(f"supervisor {sup.pid} started")

    def _ready_supervisors(self) -> list[subprocess.Popen[bytes]]:
        """The live supervisors whose signal handlers are in place (a child consumed)."""
        return [s for s in self.supervisors if s.poll() is None and self.runqueues.consuming(s)]

    def _pick(self, items: Sequence[T]) -> T:
        """One of ``items``, for one draw whatever their number (a replay draws alike)."""
        return items[min(int(self.rng.random() * len(items)), len(items) - 1)]

    # --- messages -----------------------------------------------------------------------------

    def _schedule(self, elapsed: float) -> None:
        quiet = elapsed >= self.config.seconds - QUIET_SECONDS
        kinds = [
            k
            for k in HANDLER_KINDS
            if k in self.kinds
            and not (quiet and k in HANGING)
            and not (k == "gil" and elapsed - self.last_gil < GIL_EVERY)
        ]
        if not kinds:
            return
        kind = self.rng.choices(kinds, [HANDLER_KINDS[k] for k in kinds])[0]
        if kind == "gil":
            self.last_gil = elapsed
        queue, plan = self._plan(kind)
        delay = self._pick(DELAYS)
        self._send(queue, f"{kind}-{len(self.sent)}", kind, plan, delay)

    def _send(self, queue: str, message_id: str, kind: str, plan: list[str], delay: float) -> None:
        result = self.queues[queue].schedule({"do": plan}, delay=delay, id=message_id)
        assert result.created, f"{self.fail}: {message_id} was not created"
        self.sent[message_id] = Sent(message_id, queue, kind, plan, result.due_ms)
        self.tally[kind] += 1

    def _plan(self, kind: str) -> tuple[str, list[str]]:
        """The queue and what each attempt does (the last entry for every later attempt)."""
        r = self.rng
        limit = float(self.current[THREADS]["time_limit"])
        later = "ok" if r.random() < 0.8 else self._pick(["raise", "sleep:0.2", "spin:0.2"])
        if kind == "quick":
            return THREADS, ["ok"]
        if kind == "fail":
            return THREADS, ["raise"] * MAX_ATTEMPTS if r.random() < 0.3 else ["raise", later]
        if kind == "slow":
            return THREADS, [f"sleep:{r.uniform(0.1, min(1.0, limit / 2)):.2f}", later]
        if kind == "sleep":
            return THREADS, ["sleep:600", later]
        if kind == "socket":
            return THREADS, ["block", later]
        if kind == "gil":
            # Longer than a lease set at its start can last: only a process killed in time
            # keeps it from running a second time beside itself.
            seconds = math.ceil(self.current[THREADS]["visibility_timeout"]) + r.randint(1, 3)
            return THREADS, [f"gil:{seconds}", later]
        if kind == "cpu":
            return THREADS, [f"spin:{r.uniform(0.1, limit + 2):.2f}", later]
        if kind == "subprocess":
            short = r.random() < 0.4
            seconds = r.uniform(0.2, 1.0) if short else r.uniform(limit + 2, limit + 8)
            return THREADS, [f"program:{seconds:.2f}", later]
        assert kind == "async", kind
        limit = float(self.current[ASYNC]["time_limit"])
        first = self._pick(["ok", "sleep:0.3", "sleep:600", "block", f"spin:{limit + 1.5:.2f}"])
        return ASYNC, [first, later]

    # --- events -------------------------------------------------------------------------------

    def _abort(self) -> None:
        queue = self._pick(QUEUES)
        q = self.queues[queue]
        in_flight = sorted(m.decode() for m in self.client.zrange(q.keys.unack, 0, -1))
        mine = sorted(i for i, s in self.sent.items() if s.queue == queue)
        candidates = in_flight if in_flight and self.rng.random() < 0.85 else mine
        if not candidates:
            return
        target = self._pick(candidates)
        result = q.abort(target, "fuzz")
        if result:
            self.aborted.setdefault(target, wall_ms())
        self.tally["abort" if result else "abort (not in flight)"] += 1
        self._act(f"abort {queue} {target}: {'aborted' if result else result.message}")

    def _time_limit(self) -> None:
        queue = self._pick(QUEUES)
        now = self.current[queue]
        limits = [
            t for t in TIME_LIMITS if t <= now["visibility_timeout"] - 2 and t != now["time_limit"]
        ]
        if limits:
            self._publish(queue, time_limit=self._pick(limits))

    def _visibility(self) -> None:
        queue = self._pick(QUEUES)
        self._publish(
            queue,
            visibility_timeout=self.current[queue]["time_limit"] + self._pick(VISIBILITY_OVER),
        )

    def _publish(self, queue: str, **values: float) -> None:
        """What the admin does (mirror.queue_overrides.publish): the fields, JSON, in the
        queue's config hash, and its version bumped."""
        key = self.queues[queue].keys.config
        mapping = {name: json.dumps(value) for name, value in values.items()}
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, mapping={**mapping, "updated_ms": str(wall_ms())})
        pipe.hincrby(key, "version", 1)
        pipe.execute()
        self.current[queue].update(values)
        for name in values:
            self.tally[f"edit {name}"] += 1
        self._act(f"publish {queue} {values} (now {self.current[queue]})")

    def _kill_child(self) -> None:
        children = sorted(c for s in self._ready_supervisors() for c in children_of(s.pid))
        # While a failed deploy is on disk a child may not come back (no fresh interpreter
        # starts): keep two serving.
        if not children or (self.broken_until is not None and len(children) <= 2):
            return
        pid = self._pick(children)
        self._kill(pid, "consumer process")
        self.tally["kill -9 child"] += 1

    def _kill_supervisor(self) -> None:
        ready = self._ready_supervisors()
        if self.broken_until is not None or not ready:
            return  # (a new supervisor would load the broken code)
        sup = self._pick(ready)
        self._kill(sup.pid, "supervisor")
        sup.wait(30)
        self.supervisors.remove(sup)
        self.tally["kill -9 supervisor"] += 1
        self._start_supervisor()

    def _kill(self, pid: int, what: str) -> None:
        self.deaths.watch(pid)
        self.killed[pid] = wall_ms()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self._act(f"kill -9 {what} {pid}: already gone")
            return
        self._act(f"kill -9 {what} {pid}")

    def _sighup(self) -> None:
        if self.broken_until is not None:
            return
        targets = self._hup_targets()
        if targets:
            self.version += 1
            self._deploy(broken=False)
            self._hup(targets, f"good deploy v{self.version}")
            self.tally["SIGHUP"] += 1

    def _sighup_broken(self) -> None:
        if self.broken_until is not None:
            return
        if len(self._ready_supervisors()) < sum(1 for s in self.supervisors if s.poll() is None):
            return  # a supervisor still loading (one just started) would load the broken code
        targets = self._hup_targets()
        if targets:
            self._deploy(broken=True)
            seconds = self._pick(BROKEN_SECONDS)
            self.broken_until = time.monotonic() + seconds
            self._hup(targets, f"failed deploy (fixed in {seconds} s)")
            self.tally["SIGHUP failed deploy"] += 1

    def _hup_targets(self) -> list[subprocess.Popen[bytes]]:
        ready = self._ready_supervisors()
        if not ready:
            return []
        return ready if self.rng.random() < 0.5 else [self._pick(ready)]

    def _hup(self, targets: list[subprocess.Popen[bytes]], what: str) -> None:
        for sup in targets:
            sup.send_signal(signal.SIGHUP)
        self._act(f"SIGHUP {[s.pid for s in targets]} after a {what}")

    def _deploy(self, *, broken: bool) -> None:
        app = self.code / "fuzz_release"
        app.mkdir(parents=True, exist_ok=True)
        (app / "__init__.py").write_text("")
        (app / "apps.py").write_text(RELEASE_APPS)
        (self.code / "fuzz_settings.py").write_text(SETTINGS)
        text = BROKEN_RELEASE if broken else RELEASE.format(version=self.version)
        (app / "release.py").write_text(text)

    def _fix_deploy(self) -> None:
        self.version += 1
        self._deploy(broken=False)
        self.broken_until = None
        self._act(f"the failed deploy fixed on disk (v{self.version})")

    def _end_with_a_failed_deploy(self) -> None:
        """A deploy that fails to import, SIGHUP to every supervisor, and a handler of each
        queue hung past its limit: settled all the same (the code stays broken to the end)."""
        for sup in self.supervisors:
            self.runqueues.wait(
                lambda s=sup: s.poll() is not None or self.runqueues.consuming(s),
                START_SECONDS,
                f"{self.fail}: supervisor {sup.pid} consuming",
            )
        self._deploy(broken=True)
        self.broken_until = None  # not fixed again
        self._hup(self._ready_supervisors(), "failed deploy (left broken)")
        self.tally["SIGHUP failed deploy"] += 1
        for queue in QUEUES:
            self._send(queue, f"hung-after-failed-deploy-{queue}", "sleep", ["sleep:600", "ok"], 0)

    # --- the end ------------------------------------------------------------------------------

    def _drain(self) -> None:
        self._act("scheduling stopped: draining")
        try:
            wait_until(
                lambda: all(settled(q) for q in self.queues.values()), DRAIN_SECONDS, "the drain"
            )
        except AssertionError:
            counts = {name: q.counts() for name, q in self.queues.items()}
            self.problems.append(f"not drained {DRAIN_SECONDS:g} s after the fuzzing: {counts}")
            self._act("not drained")
        else:
            self._act("drained")

    def _stop(self) -> None:
        for sup in self.supervisors:
            if sup.poll() is None:
                try:
                    wait_until(lambda s=sup: self.runqueues.consuming(s), START_SECONDS)
                except AssertionError:
                    self.problems.append(f"supervisor {sup.pid} never consumed")
                sup.send_signal(signal.SIGTERM)
        self.stopped = list(self.supervisors)
        self._act(f"SIGTERM {[s.pid for s in self.supervisors]}")
        for sup in self.supervisors:
            try:
                self.exit_codes[sup.pid] = sup.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.exit_codes[sup.pid] = None
                sup.kill()
                sup.wait()
        self._act(f"exit codes {self.exit_codes}")
        # Every consumer process the watch saw ends with its supervisor.
        consumers = [p for p in self.deaths.seen_ms if p not in self.exit_codes]
        try:
            wait_until(
                lambda: not any(self.deaths.alive(p) for p in consumers if _is_python(p)),
                DEATHS_SECONDS,
            )
        except AssertionError:
            left = [p for p in consumers if self.deaths.alive(p) and _is_python(p)]
            self.problems.append(f"consumer processes left running after the stop: {left}")
        self.deaths.stop()

    # --- the verdict --------------------------------------------------------------------------

    def check(self) -> str:
        """Assert every guarantee (see the module doc); return a summary of the run."""
        starts = read(self.runqueues.ledger)
        calls = self._calls(starts, read_runs(self.runqueues.ledger))
        self._end_calls(calls)
        by_id: dict[str, list[Call]] = {}
        for c in calls:
            by_id.setdefault(c.start.id, []).append(c)
        for rows in by_id.values():
            rows.sort(key=lambda c: (c.start.delivered_ms, c.start.attempt))
        journal = {name: _journal(self.client, q) for name, q in self.queues.items()}
        self._check_overlaps(calls)
        self._check_early(calls, journal)
        self._check_settled(by_id, journal)
        self._check_attempts(by_id, journal)
        self._check_logs()
        summary = self._summary(calls)
        report = self._report(by_id, journal)
        (self.workdir / "report.txt").write_text(summary + "\n\n" + report)
        assert not self.problems, f"{self.fail}\n{summary}\n\n{report[:14000]}"
        return summary

    def _calls(self, starts: list[Delivery], runs: list[Run]) -> list[Call]:
        ends = {(r.id, r.attempt, r.pid, r.started_ms): r for r in runs}
        calls = [Call(d, ends.pop((d.id, d.attempt, d.pid, d.delivered_ms), None)) for d in starts]
        if ends:
            self.problems.append(f"end lines without a start: {list(ends.values())[:3]}")
        by_key = {
            (c.start.id, c.start.attempt, c.start.pid, c.start.delivered_ms): c for c in calls
        }
        for part in read_parts(self.runqueues.ledger):
            call = by_key.get(part.call)
            if call is None:
                self.problems.append(f"a part without its call: {part}")
            else:
                call.parts.append(part)
        return calls

    def _end_calls(self, calls: list[Call]) -> None:
        """When each call really ended: its end line, else its process's death; later if an
        async call's thread or a program it ran outlived that."""
        now = wall_ms()
        for c in calls:
            pid = c.start.pid
            death = self.deaths.ended(pid)
            if c.run is not None:
                c.end_ms = c.run.finished_ms
                c.how = f"returned or raised at {self._rel(c.end_ms)}"
            elif death is not None:
                c.end_ms, c.how = death, f"no end line: its process ended at {self._rel(death)}"
                if pid in self.killed or c.start.ppid in self.killed:
                    c.how += " (kill -9 by the test)"
            else:
                c.end_ms, c.how = now, "no end line, its process still running at the check"
            threads = [p for p in c.parts if p.part == "thread"]
            if any(p.ended_ms == 0 for p in threads):
                ended = [p.ended_ms for p in threads if p.ended_ms]
                thread_end = ended[0] if ended else (death or now)
                if thread_end > c.end_ms:
                    c.end_ms = thread_end
                    c.how += f"; its thread ran until {self._rel(thread_end)}"
            for program in (p for p in c.parts if p.part == "program" and p.ended_ms == 0):
                seen = [
                    p.ended_ms
                    for p in c.parts
                    if p.part == "program" and p.child == program.child and p.ended_ms
                ]
                exit_ms = seen[0] if seen else self.deaths.ended(program.child) or now
                if exit_ms > c.end_ms:
                    c.end_ms = exit_ms
                    c.how += f"; its program (sleep, pid {program.child}) ran until " + (
                        self._rel(exit_ms) if exit_ms != now else "the check"
                    )

    def _check_overlaps(self, calls: list[Call]) -> None:
        # Each call as a Run that ends when the call really ended, for ledger.overlaps.
        spans = [
            Run(
                c.start.id,
                "",
                c.start.attempt,
                c.start.pid,
                c.start.delivered_ms,
                c.end_ms,
                0,
                "",
                "",
            )
            for c in calls
        ]
        owner = {id(span): c for span, c in zip(spans, calls, strict=True)}
        for first, second in overlaps(spans):
            a, b = owner[id(first)], owner[id(second)]
            self.problems.append(
                f"OVERLAP: {a.start.id} attempt {b.start.attempt} started in pid {b.start.pid} "
                f"at {self._rel(b.start.delivered_ms)} while attempt {a.start.attempt} (pid "
                f"{a.start.pid}, started {self._rel(a.start.delivered_ms)}) still ran: {a.how}"
            )

    def _check_early(self, calls: list[Call], journal: dict[str, list[list[Any]]]) -> None:
        for c in calls:
            sent = self.sent.get(c.start.id)
            if sent is None:
                self.problems.append(f"a call of a message never scheduled: {c.start}")
                continue
            due = max(sent.due_ms, c.start.due_ms)
            if c.start.delivered_ms + EARLY_TOLERANCE_MS < due:
                self.problems.append(
                    f"EARLY: {c.start.id} attempt {c.start.attempt} started "
                    f"{due - c.start.delivered_ms} ms before it was due"
                )
        for name, rows in journal.items():
            for row in rows:
                if row[6] != "cancel" and row[3] < row[2]:
                    self.problems.append(f"EARLY: {name} journal says delivered before due: {row}")

    def _check_settled(
        self, by_id: dict[str, list[Call]], journal: dict[str, list[list[Any]]]
    ) -> None:
        for name, q in self.queues.items():
            k = q.keys
            acks = Counter(row[0] for row in journal[name] if row[6] == "ack")
            dead = {m.decode() for m in self.client.zrange(k.garbage, 0, -1)}
            stored = {m.decode() for m in self.client.hkeys(k.messages)}
            for message_id, sent in self.sent.items():
                if sent.queue != name:
                    continue
                acked, is_dead = acks[message_id], message_id in dead
                if acked + is_dead != 1:
                    where = _where(self.client, q, message_id)
                    self.problems.append(
                        f"NOT SETTLED: {message_id} acknowledged {acked} time(s), dead letter "
                        f"{is_dead} (now {where or 'gone'}), {len(by_id.get(message_id, []))} "
                        "call(s)"
                    )
                elif is_dead and not self.client.hget(k.reasons, message_id):
                    self.problems.append(f"NOT SETTLED: {message_id} dead without a reason")
            left = stored - dead
            if left:
                self.problems.append(f"{name}: payloads left that are not dead letters: {left}")

    def _check_attempts(
        self, by_id: dict[str, list[Call]], journal: dict[str, list[list[Any]]]
    ) -> None:
        for name, q in self.queues.items():
            rows_by_id: dict[str, list[list[Any]]] = {}
            for row in journal[name]:
                if row[6] != "cancel":
                    rows_by_id.setdefault(row[0], []).append(row)
            dead = {m.decode() for m in self.client.zrange(q.keys.garbage, 0, -1)}
            for message_id, sent in self.sent.items():
                if sent.queue != name:
                    continue
                calls = by_id.get(message_id, [])
                attempts = [c.start.attempt for c in calls]
                ran = set(attempts)
                last = max(attempts, default=0)
                if any(b <= a for a, b in pairwise(attempts)):
                    self.problems.append(
                        f"MISCOUNT: {message_id} attempts in the order they started: {attempts}"
                    )
                if last > MAX_ATTEMPTS:
                    self.problems.append(
                        f"MISCOUNT: {message_id} ran attempt {last} of {MAX_ATTEMPTS}"
                    )
                rows = rows_by_id.get(message_id, [])
                # The journal is one stream every process appends to once Redis replied; a
                # failure's row rides on its process's next round after the nack, so a process
                # stalled in between (a handler holding the GIL beside it) can append it after
                # the retry another process already ran: rows carry their attempt, readers
                # order by it. An attempt journaled twice is a miscount.
                numbers = [int(row[5]) for row in rows]
                if len(set(numbers)) != len(numbers):
                    self.problems.append(
                        f"MISCOUNT: {message_id} journals an attempt twice: {numbers}"
                    )
                # (An abort can bury a claimed message before its handler starts.)
                unran = {int(row[5]) for row in rows if int(row[5]) not in ran}
                if message_id in self.aborted:
                    unran -= {int(row[5]) for row in rows if row[6] == "garbage"}
                if unran:
                    self.problems.append(
                        f"MISCOUNT: {message_id} journaled attempts {sorted(unran)} "
                        f"that never started (started: {attempts})"
                    )
                for row in rows:
                    if row[6] == "ack" and int(row[5]) != last:
                        self.problems.append(
                            f"MISCOUNT: {message_id} acknowledged on attempt {row[5]}, but "
                            f"attempt {last} ran"
                        )
                if message_id not in dead:
                    continue
                raw = self.client.hget(q.keys.attempts, message_id)
                counted = int(raw) if raw is not None else 0
                reason = (self.client.hget(q.keys.reasons, message_id) or b"").decode()
                if counted < last:
                    self.problems.append(
                        f"MISCOUNT: {message_id} dead with {counted} attempt(s) counted, "
                        f"attempt {last} ran"
                    )
                if reason.startswith("aborted"):
                    if message_id not in self.aborted:
                        self.problems.append(f"{message_id} dead as aborted, never aborted")
                    # The abort buried the attempt that ran last, unless it landed on a later
                    # claim that never started (released or reaped: counted, never journaled),
                    # after the last run's own outcome (a retry) was written.
                    lasts = [row for row in rows if int(row[5]) == last]
                    if lasts and counted == last and lasts[-1][6] != "garbage":
                        self.problems.append(
                            f"ABORT: {message_id} aborted, but its last attempt is journaled "
                            f"{lasts[-1][6]} ({lasts[-1][7]}): {reason}"
                        )
                elif counted != MAX_ATTEMPTS:
                    self.problems.append(
                        f"MISCOUNT: {message_id} dead after {counted} of {MAX_ATTEMPTS} "
                        f"attempts, not aborted: {reason}"
                    )

    def _check_logs(self) -> None:
        lines = [
            line for line in self.runqueues.logs().splitlines() if any(a in line for a in ALARMS)
        ]
        if lines:
            self.problems.append(f"runqueue logged internal failures: {lines[:5]}")
        for sup in self.stopped:
            if self.exit_codes.get(sup.pid) != 0:
                said = [
                    line for line in self.runqueues.log(sup).splitlines() if "stopped with" in line
                ]
                self.problems.append(
                    f"supervisor {sup.pid} exited {self.exit_codes.get(sup.pid)} on SIGTERM (not "
                    f"0); what it said of its processes that did not stop cleanly: {said[-4:]}"
                )

    def _summary(self, calls: list[Call]) -> str:
        kills = sum(1 for a in self.actions if "kill -9" in a)
        return (
            f"{len(self.sent)} messages {dict(sorted(self.tally.items()))}; {len(calls)} "
            f"handler calls, {sum(1 for c in calls if c.run is None)} without an end line; "
            f"{kills} kill -9; {len(self.problems)} problem(s); late-seen deaths "
            f"{len(self.deaths.late)}"
        )

    def _report(self, by_id: dict[str, list[Call]], journal: dict[str, list[list[Any]]]) -> str:
        """Every problem, then an excerpt for each message a problem names (the first 12)."""
        lines = [f"- {p}" for p in self.problems]
        named: list[str] = []
        for problem in self.problems:
            for word in re.split(r"[^\w-]+", problem):
                if word in self.sent and word not in named:
                    named.append(word)
        logs = self.runqueues.logs().splitlines()
        for message_id in named[:12]:
            lines += ["", *self._excerpt(message_id, by_id.get(message_id, []), journal, logs)]
        return "\n".join(lines)

    def _excerpt(
        self,
        message_id: str,
        calls: list[Call],
        journal: dict[str, list[list[Any]]],
        logs: list[str],
    ) -> list[str]:
        sent = self.sent[message_id]
        out = [
            f"{message_id} ({sent.queue}, {sent.kind}): plan {sent.plan}, due "
            f"{self._rel(sent.due_ms)}"
            + (
                f", aborted at {self._rel(self.aborted[message_id])}"
                if message_id in self.aborted
                else ""
            )
        ]
        pids: set[int] = set()
        for c in calls:
            pids |= {c.start.pid, c.start.ppid}
            out.append(
                f"  attempt {c.start.attempt} in pid {c.start.pid} (supervisor "
                f"{c.start.ppid}): started {self._rel(c.start.delivered_ms)}, "
                f"{c.run.action if c.run else ''} {c.how}"
            )
            for p in c.parts:
                pids.add(p.child)
                state = f"ended {self._rel(p.ended_ms)}" if p.ended_ms else "started"
                out.append(f"    {p.part} {p.child or ''} {state}")
        for pid in sorted(pids - {0}):
            if pid in self.deaths.seen_ms:
                killed = (
                    f", kill -9 by the test at {self._rel(self.killed[pid])}"
                    if pid in self.killed
                    else ""
                )
                out.append(f"  pid {pid}: ended {self._rel(self.deaths.ended_ms.get(pid))}{killed}")
        for row in journal[sent.queue]:
            if row[0] == message_id:
                out.append(
                    f"  journal: attempt {row[5]} {row[6]} {row[7]!r} delivered "
                    f"{self._rel(row[3])} finished {self._rel(row[4])}"
                )
        out.append(f"  now: {_where(self.client, self.queues[sent.queue], message_id) or 'gone'}")
        out += [f"  log: {line}" for line in logs if message_id in line][:8]
        out += [f"  action: {a}" for a in self.actions if any(str(p) in a for p in pids - {0})][:8]
        return out


def _journal(client: redis.Redis, q: Queue) -> list[list[Any]]:
    """Every journal row of ``q`` in stream order: [id, scheduled, due, delivered, finished,
    attempt, outcome, error, ...]."""
    return [row for _, fields in client.xrange(q.keys.journal) for row in json.loads(fields[b"o"])]


def _where(client: redis.Redis, q: Queue, message_id: str) -> str:
    """The states ``message_id`` is in now, with its attempts and reason."""
    k = q.keys
    states = [
        s
        for s in ("pending", "unack", "retry", "garbage")
        if client.zscore(getattr(k, s), message_id) is not None
    ]
    if message_id.encode() in client.lrange(k.ready, 0, -1):
        states.append("ready")
    if not states:
        return ""
    attempts = client.hget(k.attempts, message_id)
    reason = client.hget(k.reasons, message_id)
    reason_text = reason.decode() if reason else None
    return f"{'+'.join(states)}, attempts {attempts and attempts.decode()}, reason {reason_text!r}"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_python(pid: int) -> bool:
    return any("python" in word for word in _cmdline(pid)[:1])


def _is_ours(pid: int) -> bool:
    """A consumer process or a handler's ``sleep`` (not a pid reused by someone else's)."""
    argv = _cmdline(pid)
    return bool(argv) and (argv[0] == "sleep" or "runqueue" in argv or _is_python(pid))
