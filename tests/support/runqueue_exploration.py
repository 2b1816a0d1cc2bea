"""A randomized run of real ``manage.py runqueue`` processes over three queues, and its verdict.

The drill project (tests/support/drill_settings.py, tests/support/drill_app) has queues "drill",
"drill2" and "drill3", served by one receiver that does, on each attempt, what the message's plan
says: return, raise, raise SystemExit or another BaseException, ask for a retry with a good delay
or with one set to inf, nan, -1 or 1e300 after construction, reject, or sleep a couple of seconds
past the visibility timeout (the extender must keep the message). It records every call in the
shared ledger file (tests/support/ledger.py): start and end wall times and the outcome.

One :class:`Exploration` draws everything from one seeded ``random.Random``: each queue's
settings, one or two ``runqueue`` processes each serving several queues (all configured ones
by default, or named ones), the messages and their plans, the cancels, re-schedules of the
same id, requeues and purges of dead letters that race the deliveries, and maybe one SIGTERM
of a runqueue (a random ``--grace``; mostly sent while a sleeping handler runs in it, so that a
short grace gives that message back) followed by a restart. A failure names its seed, and
``DQ_EXPLORE_SEED=<seed>`` replays the same draws (the deliveries' timing is the machine's).

:meth:`Exploration.check` then proves: every message ended acknowledged, cancelled, purged or
dead with a reason, and Redis holds nothing else; no two calls of one id ran at once unless a
SIGTERM gave the first one back after --grace (``ledger.Causes``); none started before its
due time; the journal has one row per finished call (ack, retry, garbage) and one "cancel" row
per cancel that succeeded; the runqueues drained the queues, logged no internal failure and
exited 0 on SIGTERM.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from drill import Runqueues, producer, settled
from ledger import EARLY_TOLERANCE_MS, Causes, Delivery, Run, read, read_runs
from waiting import wait_until

from django_delayqueue.core import Queue

QUEUES = ("drill", "drill2", "drill3")
KINDS = ("ok", "raise", "base", "retry", "badretry", "reject", "slow")
WEIGHTS = (40, 12, 8, 10, 5, 5, 2)
BAD_DELAYS = ("inf", "nan", "-1", "1e300")
MAX_SLOW = 2  # sleeping handlers per run: each holds a slot for a few seconds
SLOW_OVER_SECONDS = 2.0  # how far past the visibility timeout a sleeping handler runs
DELAYS = (0, 0, 0, 0.05, 0.2, 0.5, 1.0)
RACES = ("cancel", "reschedule", "requeue", "purge", "none")
RACE_WEIGHTS = (10, 8, 6, 4, 12)
STEPS = 40  # race steps; the second half of the messages is scheduled during the first ones
DRAIN_SECONDS = 120.0  # not drained by then: a wedged runqueue
STOP_SECONDS = 60.0  # not exited that long after SIGTERM: a wedged runqueue
START_SECONDS = 60.0  # not consuming that long after it was started: a wedged runqueue
# A handler that finished this long before the earliest possible end of --grace must have
# been recorded (its ledger time is read a moment before the consumer sees it finish).
GIVE_BACK_SLACK_MS = 50
# Log lines no run without Redis faults may show: each means an outcome, a claim or an
# extension went wrong inside runqueue (handler failures are logged too, but not like this).
ALARMS = (
    "consumer step failed",
    "handler thread failed",
    ".lua failed",
    "could not ",
    "not recorded",
    "dropped after",
)


@dataclass
class Stop:
    """One runqueue the test stopped with SIGTERM while messages were still flowing."""

    pid: int
    sent_ms: int
    grace_ms: int
    exited_ms: int | None = None


@dataclass
class Tally:
    """What the test did to the queues (per (queue, id) unless said otherwise)."""

    created: Counter[tuple[str, str]] = field(default_factory=Counter)
    due: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (q, id, gen) -> due
    gen: dict[tuple[str, str], int] = field(default_factory=dict)  # latest gen created
    cancelled: Counter[tuple[str, str]] = field(default_factory=Counter)
    purged: Counter[tuple[str, str]] = field(default_factory=Counter)
    requeued: Counter[tuple[str, str]] = field(default_factory=Counter)


class Exploration:
    def __init__(self, url: str, client: redis.Redis, workdir: Path, seed: int) -> None:
        self.url = url
        self.client = client
        self.seed = seed
        self.rng = random.Random(seed)
        r = self.rng
        self.settings = {name: self._queue_settings() for name in QUEUES}
        self.layouts = self._layouts()
        self.concurrency = [
            ("--concurrency", str(r.randint(1, 3))) if r.random() < 0.25 else ()
            for _ in self.layouts
        ]
        self.stop_step = r.randrange(STEPS) if r.random() < 0.5 else None
        self.stop_which = r.randrange(len(self.layouts))
        self.stop_grace = r.choice([0.5, 1.5, 30.0])
        # Most stops wait for a sleeping handler on that runqueue first: with a short --grace
        # it stays in flight past the exit (the case to prove: never redelivered beside its
        # running handler), with 30 s it finishes before the exit.
        self.stop_mid_handler = r.random() < 0.7
        self.count = r.randint(24, 40)
        self.slow_left = MAX_SLOW
        self.queues: dict[str, Queue] = {name: producer(url, name) for name in QUEUES}
        self.ids = [
            (name, f"{name}-m{i}") for i, name in enumerate(r.choices(QUEUES, k=self.count))
        ]
        self.tally = Tally()
        self.stops: list[Stop] = []
        self.log: list[str] = []
        self.runqueues = Runqueues(url, workdir, env={"DRILL_QUEUES": json.dumps(self.settings)})
        self.live: list[tuple[int, subprocess.Popen[bytes]]] = []  # (layout index, process)
        self.started_s = time.monotonic()

    @property
    def fail(self) -> str:
        return (
            f"seed {self.seed} (replay: DQ_EXPLORE_SEED={self.seed}; ledger, runqueue logs and "
            f"the test's actions in {self.runqueues.workdir})"
        )

    def close(self) -> None:
        """Kill any runqueue still running and keep the test's actions next to the logs."""
        self.runqueues.close()
        (self.runqueues.workdir / "actions.log").write_text("\n".join(self.log) + "\n")

    def describe(self) -> str:
        layouts = [" ".join(names) or "(every queue)" for names in self.layouts]
        stop = (
            "none"
            if self.stop_step is None
            else f"step {self.stop_step}, --grace {self.stop_grace}, mid-handler "
            f"{self.stop_mid_handler}"
        )
        return (
            f"{self.fail}: {self.count} messages; settings {self.settings}; runqueues {layouts} "
            f"{self.concurrency}; SIGTERM+restart: {stop}"
        )

    # --- the draws -----------------------------------------------------------------------------

    def _queue_settings(self) -> dict[str, Any]:
        r = self.rng
        return {
            "visibility_timeout": r.choice([1, 2]),
            "max_attempts": r.randint(2, 4),
            "backoff_base": 0.02,
            "backoff_max": r.choice([0.1, 0.3]),
            "concurrency": r.randint(1, 3),
            "claim_batch": r.randint(1, 10),
        }

    def _layouts(self) -> list[tuple[str, ...]]:
        """The queues each runqueue is started with; () is the default, every configured one."""
        r = self.rng
        layouts: list[tuple[str, ...]] = []
        for _ in range(r.choice([1, 2])):
            if r.random() < 0.4:
                layouts.append(())
                continue
            names = r.sample(QUEUES, r.randint(2, 3))
            if r.random() < 0.2:
                names.append("order-close")  # a demo queue with nothing scheduled on it
            layouts.append(tuple(names))
        if () not in layouts:
            served = {name for names in layouts for name in names}
            layouts[-1] += tuple(name for name in QUEUES if name not in served)
        return layouts

    def _plan(self, name: str) -> list[str]:
        r = self.rng
        plan = []
        for _ in range(r.randint(1, 4)):
            kind = r.choices(KINDS, WEIGHTS)[0]
            if kind == "slow" and self.slow_left <= 0:
                kind = "ok"
            if kind == "slow":
                self.slow_left -= 1
                over = self.settings[name]["visibility_timeout"] + SLOW_OVER_SECONDS
                plan.append(f"sleep:{over}")
            elif kind == "base":
                plan.append(r.choice(["systemexit", "baseexception"]))
            elif kind == "retry":
                plan.append(f"retry:{r.choice([0, 0.02, 0.1, 0.3])}")
            elif kind == "badretry":
                plan.append(f"badretry:{r.choice(BAD_DELAYS)}")
            else:
                plan.append(kind)
        return plan

    # --- driving a run --------------------------------------------------------------------------

    def schedule(
        self, name: str, message_id: str, plan: list[str] | None = None, delay: float | None = None
    ) -> None:
        key = (name, message_id)
        gen = self.tally.gen.get(key, -1) + 1
        payload = {"do": plan or self._plan(name), "gen": gen}
        if delay is None:
            delay = self.rng.choice(DELAYS)
        result = self.queues[name].schedule(payload, delay=delay, id=message_id)
        self.log.append(f"schedule {message_id} gen {gen}: {payload['do']} -> {result.created}")
        if result.created:
            self.tally.created[key] += 1
            self.tally.gen[key] = gen
            self.tally.due[(name, message_id, gen)] = result.due_ms

    def _start(self, index: int, grace: float | None = None) -> None:
        args = [*self.concurrency[index]]
        if grace is not None:
            args += ["--grace", str(grace)]
        proc = self.runqueues.start(*args, queues=self.layouts[index])
        self.live.append((index, proc))

    def run(self) -> None:
        half = self.count // 2
        for name, message_id in self.ids[:half]:
            self.schedule(name, message_id)
        for index in range(len(self.layouts)):
            stopped_later = self.stop_step is not None and index == self.stop_which
            self._start(index, self.stop_grace if stopped_later else None)
        later = self.ids[half:]
        for step in range(STEPS):
            if step < len(later):
                self.schedule(*later[step])
            if step == self.stop_step:
                self._send_stop()
            self._race()
            self._restart_if_stopped()
        if self.stops and self.stops[-1].exited_ms is None:
            self.runqueues.wait(self._restart_if_stopped, STOP_SECONDS, f"{self.fail}: SIGTERM")
        self.runqueues.wait(self._drained, DRAIN_SECONDS, f"{self.fail}: the queues to drain")
        for _, proc in self.live:
            self._wait_consuming(proc)
            proc.send_signal(signal.SIGTERM)
        for _, proc in self.live:
            self._assert_exits_0(proc)

    def _wait_consuming(self, proc: subprocess.Popen[bytes]) -> None:
        """Until ``proc`` handles SIGTERM (a signal while Django loads kills it, exit -15)."""
        what = f"{self.fail}: runqueue {proc.pid} to start consuming"
        self.runqueues.wait(lambda: self.runqueues.consuming(proc), START_SECONDS, what)

    def _send_stop(self) -> None:
        (index, proc), *_ = [(i, p) for i, p in self.live if i == self.stop_which]
        self._wait_consuming(proc)
        if self.stop_mid_handler:
            name = self.rng.choice([q for q in QUEUES if q in (self.layouts[index] or QUEUES)])
            seconds = self.settings[name]["visibility_timeout"] + SLOW_OVER_SECONDS
            self.schedule(name, f"{name}-stop", [f"sleep:{seconds}", "ok"], delay=0)
            # Bounded, and no failure if it never shows: the other runqueue may take it.
            try:
                wait_until(lambda: self._running_in(proc.pid), seconds + 5, "a handler to stop")
            except AssertionError:
                self.log.append(f"no handler running in {proc.pid} to stop")
        sent = int(time.time() * 1000)
        proc.send_signal(signal.SIGTERM)
        self.stops.append(Stop(proc.pid, sent, int(self.stop_grace * 1000)))
        self.log.append(f"SIGTERM runqueue {proc.pid} (layout {index})")

    def _running_in(self, pid: int) -> bool:
        """Whether the ledger shows a handler call in ``pid`` that has not ended yet."""
        ended = {(r.id, r.attempt, r.started_ms) for r in read_runs(self.runqueues.ledger)}
        return any(
            d.ran_under(pid) and (d.id, d.attempt, d.delivered_ms) not in ended
            for d in read(self.runqueues.ledger)
        )

    def _restart_if_stopped(self) -> bool:
        """Restart the stopped runqueue once it exited; True when there is none left to wait for."""
        if not self.stops or self.stops[-1].exited_ms is not None:
            return True
        stop = self.stops[-1]
        (index, proc), *_ = [(i, p) for i, p in self.live if p.pid == stop.pid]
        if proc.poll() is None:
            return False
        stop.exited_ms = int(time.time() * 1000)
        assert proc.returncode == 0, f"{self.fail}: runqueue {proc.pid} exited {proc.returncode}"
        self.live.remove((index, proc))
        self._start(index)
        self.log.append(f"restarted layout {index} as {self.live[-1][1].pid}")
        return True

    def _assert_exits_0(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            code = proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.fail}: runqueue {proc.pid} ignored SIGTERM for {STOP_SECONDS}s\n"
                + self.runqueues.logs()[-4000:]
            ) from None
        assert code == 0, f"{self.fail}: runqueue {proc.pid} exited {code}\n{self._logs_tail()}"

    def _race(self) -> None:
        """One random action racing the deliveries, then a short pause."""
        r = self.rng
        kind = r.choices(RACES, RACE_WEIGHTS)[0]
        name, message_id = self._target(kind)
        q = self.queues[name]
        key = (name, message_id)
        if kind == "cancel":
            done = q.cancel(message_id)
            self.tally.cancelled[key] += done
        elif kind == "reschedule":
            self.schedule(name, message_id)
            done = None
        elif kind == "requeue":
            done = q.requeue(message_id)
            self.tally.requeued[key] += done
        elif kind == "purge":
            done = q.purge(message_id)
            self.tally.purged[key] += done
        else:
            done = None
        if kind not in ("none", "reschedule"):
            self.log.append(f"{kind} {message_id} -> {done}")
        time.sleep(r.choice([0, 0.02, 0.05, 0.1, 0.2]))

    def _target(self, kind: str) -> tuple[str, str]:
        """Mostly an id the action can succeed on (a dead letter, a waiting message)."""
        r = self.rng
        name = r.choice(QUEUES)
        keys = self.queues[name].keys
        if kind in ("requeue", "purge") and r.random() < 0.7:
            candidates = self.client.zrange(keys.garbage, 0, -1)
        elif kind == "cancel" and r.random() < 0.5:
            candidates = self.client.zrange(keys.pending, 0, -1) + self.client.zrange(
                keys.retry, 0, -1
            )
        else:
            candidates = []
        if candidates:
            return name, sorted(c.decode() for c in candidates)[r.randrange(len(candidates))]
        return r.choice(self.ids)

    def _drained(self) -> bool:
        return all(settled(q) for q in self.queues.values())

    def _logs_tail(self) -> str:
        return "--- runqueue logs (tail) ---\n" + self.runqueues.logs()[-4000:]

    # --- the verdict ---------------------------------------------------------------------------

    def check(self) -> str:
        """Assert every guarantee; return a one-line summary of what the run exercised."""
        starts = read(self.runqueues.ledger)
        runs = read_runs(self.runqueues.ledger)
        assert starts, f"{self.fail}: no handler ever ran\n{self._logs_tail()}"
        calls = self._calls(starts, runs)
        self._check_never_early(calls)
        given_back = self._given_back(calls)
        overlaps = self._check_no_overlap(calls, given_back)
        for name in QUEUES:
            self._check_journal(name, calls, given_back)
            self._check_keys(name)
        self._check_accounting()
        self._check_dead_letters(calls)
        logs = self.runqueues.logs()
        alarms = [line for line in logs.splitlines() if any(a in line for a in ALARMS)]
        assert not alarms, f"{self.fail}: runqueue logged internal failures: {alarms[:5]}"
        actions = Counter(c.run.action.split(":")[0] if c.run else "unfinished" for c in calls)
        t = self.tally
        return (
            f"seed {self.seed}: {time.monotonic() - self.started_s:.1f}s, {len(calls)} calls "
            f"{dict(actions)}; created {t.created.total()}, cancelled {t.cancelled.total()}, "
            f"requeued {t.requeued.total()}, purged {t.purged.total()}; "
            f"SIGTERMs {len(self.stops)}, maybe given back {len(given_back)}, overlaps {overlaps}"
        )

    def _calls(self, starts: list[Delivery], runs: list[Run]) -> list[Call]:
        """Each start line with its end line (if the call returned or raised)."""
        ends = {(r.id, r.attempt, r.pid, r.started_ms): r for r in runs}
        assert len(ends) == len(runs), f"{self.fail}: two end lines for one call"
        calls = [Call(d, ends.pop((d.id, d.attempt, d.pid, d.delivered_ms), None)) for d in starts]
        assert not ends, f"{self.fail}: end lines without a start: {list(ends.values())[:3]}"
        exits = {s.pid: s.exited_ms for s in self.stops}
        for c in calls:
            if c.run is None:
                # Never finished: only a handler left running by a SIGTERMed runqueue may (its
                # process exited under it).
                # (runqueue's pid is the parent of the consumer process that ran the handler)
                pid = c.start.ppid if c.start.ppid in exits else c.start.pid
                assert pid in exits, f"{self.fail}: a handler never finished: {c.start}"
                c.end_ms = exits[pid] or int(time.time() * 1000)
            else:
                c.end_ms = c.run.finished_ms
        return calls

    def _check_never_early(self, calls: list[Call]) -> None:
        for c in calls:
            due = c.start.due_ms
            if c.run is not None and c.run.gen is not None:
                queue_id_gen = (c.run.queue, c.run.id, c.run.gen)
                assert queue_id_gen in self.tally.due, f"{self.fail}: unknown delivery {c.run}"
                due = max(due, self.tally.due[queue_id_gen])
            assert c.start.delivered_ms + EARLY_TOLERANCE_MS >= due, (
                f"{self.fail}: {c.start.id} attempt {c.start.attempt} started "
                f"{due - c.start.delivered_ms} ms before it was due: {c.start}"
            )

    def _given_back(self, calls: list[Call]) -> set[int]:
        """Calls (by index) that a SIGTERM may have given back: running past --grace."""
        stops = {s.pid: s for s in self.stops}
        out = set()
        for i, c in enumerate(calls):
            stop = stops.get(c.start.ppid, stops.get(c.start.pid))
            if stop is None or c.start.delivered_ms > (stop.exited_ms or c.start.delivered_ms):
                continue
            if c.run is None or c.end_ms >= stop.sent_ms + stop.grace_ms - GIVE_BACK_SLACK_MS:
                out.add(i)
        return out

    def _check_no_overlap(self, calls: list[Call], given_back: set[int]) -> int:
        """No two calls of one id at once, unless the first was given back; returns how many."""
        causes = Causes(outgraced_pids={s.pid for s in self.stops})
        sent = {s.pid: s.sent_ms for s in self.stops}
        by_id: dict[str, list[int]] = {}
        for i, c in enumerate(calls):
            by_id.setdefault(c.start.id, []).append(i)
        overlaps = 0
        for message_id, indexes in by_id.items():
            indexes.sort(key=lambda i: calls[i].start.delivered_ms)
            for n, i in enumerate(indexes):
                a = calls[i]
                for j in indexes[n + 1 :]:
                    b = calls[j]
                    if b.start.delivered_ms >= a.end_ms:
                        continue
                    cause = causes.explain_overlap(a.start)
                    assert (
                        cause is not None
                        and i in given_back
                        and b.start.delivered_ms >= sent.get(a.start.ppid, sent.get(a.start.pid, 0))
                    ), f"{self.fail}: {message_id} ran twice at once: {a} and {b}"
                    overlaps += 1
        return overlaps

    def _check_journal(self, name: str, calls: list[Call], given_back: set[int]) -> None:
        q = self.queues[name]
        rows = journal(self.client, q)
        required: Counter[tuple[str, int, str]] = Counter()
        optional: Counter[tuple[str, int, str]] = Counter()
        for i, c in enumerate(calls):
            if c.run is None or c.run.queue != name:
                continue
            key = (c.run.id, c.run.attempt, c.run.outcome)
            (optional if i in given_back else required)[key] += 1
        seen = Counter((row[0], row[5], row[6]) for row in rows if row[6] != "cancel")
        missing, extra = required - seen, seen - (required + optional)
        assert not missing and not extra, (
            f"{self.fail}: {name}: handler calls without a journal row {dict(missing)}, "
            f"journal rows without a handler call {dict(extra)}"
        )
        early = [row for row in rows if row[6] != "cancel" and row[3] < row[2]]
        assert not early, f"{self.fail}: {name}: journal says delivered before due: {early[:3]}"
        cancels = Counter(row[0] for row in rows if row[6] == "cancel")
        expected = Counter({i: n for (qn, i), n in self.tally.cancelled.items() if qn == name})
        assert cancels == +expected, (
            f"{self.fail}: {name}: cancel rows {dict(cancels)} vs cancels {dict(+expected)}"
        )

    def _check_keys(self, name: str) -> None:
        """Drained: only dead letters are left, each with a reason, and nothing orphaned."""
        k = self.queues[name].keys
        counts = self.queues[name].counts()
        assert settled(self.queues[name]), f"{self.fail}: {name}: not drained: {counts}"
        dead = {m.decode() for m in self.client.zrange(k.garbage, 0, -1)}
        stored = {m.decode() for m in self.client.hkeys(k.messages)}
        assert stored == dead, f"{self.fail}: {name}: payloads {stored - dead} not dead letters"
        for message_id in dead:
            reason = self.client.hget(k.reasons, message_id)
            assert reason, f"{self.fail}: {name}: {message_id} dead without a reason"
        for key in (k.attempts, k.tokens, k.reasons):
            orphans = {m.decode() for m in self.client.hkeys(key)} - stored
            assert not orphans, f"{self.fail}: {name}: {key} keeps gone messages {orphans}"

    def _check_accounting(self) -> None:
        """Each message created ended once: acknowledged, cancelled, purged or still dead."""
        acks: Counter[tuple[str, str]] = Counter()
        dead: set[tuple[str, str]] = set()
        for name, q in self.queues.items():
            acks.update((name, row[0]) for row in journal(self.client, q) if row[6] == "ack")
            dead |= {(name, m.decode()) for m in self.client.zrange(q.keys.garbage, 0, -1)}
        t = self.tally
        for key in set(t.created) | set(acks) | dead:
            ended = acks[key] + t.cancelled[key] + t.purged[key] + (key in dead)
            assert ended == t.created[key], (
                f"{self.fail}: {key[1]} created {t.created[key]} time(s) but ended {ended}: "
                f"acks {acks[key]}, cancels {t.cancelled[key]}, purges {t.purged[key]}, "
                f"dead now {key in dead}"
            )

    def _check_dead_letters(self, calls: list[Call]) -> None:
        """A dead letter's last call rejected it or used its last attempt."""
        last: dict[tuple[str, str], int] = {}
        for i, c in enumerate(calls):
            queue = c.run.queue if c.run is not None else self._queue_of(c.start.id)
            key = (queue, c.start.id)
            if key not in last or calls[last[key]].start.delivered_ms <= c.start.delivered_ms:
                last[key] = i
        for name, q in self.queues.items():
            limit = self.settings[name]["max_attempts"]
            for m in self.client.zrange(q.keys.garbage, 0, -1):
                key = (name, m.decode())
                assert key in last, f"{self.fail}: {key[1]} dead without ever running"
                c = calls[last[key]]
                rejected = c.run is not None and c.run.outcome == "garbage"
                assert rejected or c.start.attempt >= limit, (
                    f"{self.fail}: {key[1]} dead after attempt {c.start.attempt} of {limit}: "
                    f"{c} (reason {self.client.hget(q.keys.reasons, key[1])!r})"
                )

    @staticmethod
    def _queue_of(message_id: str) -> str:
        return message_id.partition("-")[0]  # ids are "<queue>-m<n>" and "<queue>-stop"


@dataclass
class Call:
    """One handler call: its start line, and its end line unless it never finished."""

    start: Delivery
    run: Run | None
    end_ms: int = 0


def journal(client: redis.Redis, q: Queue) -> list[list[Any]]:
    """Every journal row of ``q``: [id, scheduled, due, delivered, finished, attempt, outcome,
    error]."""
    return [row for _, fields in client.xrange(q.keys.journal) for row in json.loads(fields[b"o"])]
