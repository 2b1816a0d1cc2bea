"""A randomized run of real consumers over several queues, and the ledger that judges it.

One :class:`Exploration` schedules messages on three queues, each message carrying the plan of
what its handler does on each attempt (return, raise, raise a BaseException, ask for a retry
with a good or a bad delay, reject, outlive the visibility timeout). Two consumers deliver
them while the test races cancels, re-schedules, requeues and purges against the deliveries,
edits settings the way staff would in the admin, and injects faults (connections killed, one
queue's token counter made unreadable for a while). Everything is drawn from one seeded
``random.Random``: a failure prints its seed, and ``DQ_EXPLORE_SEED=<seed>`` replays it.

:meth:`Exploration.check` then proves, for every message: it ended acknowledged, cancelled or
dead with a reason; no two deliveries of it ran at once; none started before its due time; the
journal holds exactly one row per handler outcome and per cancel; and the consumers made
progress (the run drained within its bound).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from django_delayqueue.core import Message, Queue, QueueSettings, Reject, Retry, SystemClock
from django_delayqueue.core.consumer.loop import Consumer

QUEUES = ("alpha", "beta", "gamma")
MAX_ATTEMPTS_LOW, MAX_ATTEMPTS_HIGH = 2, 4  # every queue's max_attempts, edits included
ACTIONS = ("return", "raise", "base", "retry", "retry_bad", "reject", "slow")
WEIGHTS = (40, 12, 8, 10, 5, 5, 2)
SLOW_SECONDS = 1.3  # past a 1 s visibility timeout: only the extender keeps the message
DRAIN_SECONDS = 90.0  # a run that has not drained by then is a wedged consumer


class HandlerBaseException(BaseException):
    """What a library might raise past ``except Exception``."""


@dataclass(frozen=True)
class Run:
    """One handler call, as the handler saw it."""

    queue: str
    id: str
    gen: int
    attempt: int
    due_ms: int
    started_ms: float
    finished_ms: float
    status: str  # what the journal must say: ack, retry or garbage


@dataclass
class Ledger:
    runs: list[Run] = field(default_factory=list)
    cancelled: Counter[str] = field(default_factory=Counter)  # per queue, what cancel() said
    cancelled_ids: set[tuple[str, str]] = field(default_factory=set)
    purged: set[tuple[str, str]] = field(default_factory=set)
    scheduled: dict[tuple[str, str], int] = field(default_factory=dict)  # latest gen per id
    lock: threading.Lock = field(default_factory=threading.Lock)


BAD_DELAYS = (math.inf, math.nan, -1.0, 1e300, "soon")
BASE_EXCEPTIONS = (SystemExit, GeneratorExit, HandlerBaseException)


def _bad_retry(message: Message) -> Retry:
    # Past Retry's own check (which refuses these when raised): the consumer must still cope.
    error = Retry(reason="bad delay")
    error.delay = BAD_DELAYS[(len(message.id) + message.attempt) % len(BAD_DELAYS)]
    return error


class Exploration:
    def __init__(self, client: redis.Redis, seed: int, messages: int = 40) -> None:
        self.client = client
        self.seed = seed
        self.rng = random.Random(seed)
        self.count = messages
        self.ledger = Ledger()
        self.queues = {
            name: Queue(client, name, settings=self._settings(), clock=SystemClock())
            for name in QUEUES
        }
        self.edits: dict[str, QueueSettings] = {}  # applied by the consumers' refresh()
        self.log: list[str] = []

    def _settings(self) -> QueueSettings:
        r = self.rng
        return QueueSettings(
            max_attempts=r.randint(MAX_ATTEMPTS_LOW, MAX_ATTEMPTS_HIGH),
            backoff_base=0.01,
            backoff_max=0.05,
            visibility_timeout=r.choice([1, 2]),
            concurrency=r.randint(1, 3),
            claim_batch=r.randint(1, 10),
        )

    # --- the handler -----------------------------------------------------------------------------

    def handle(self, message: Message) -> None:
        started = time.time() * 1000
        plan = message.payload["plan"]
        action = plan[min(message.attempt, len(plan)) - 1]
        status = {"return": "ack", "reject": "garbage"}.get(action, "retry")
        try:
            if action == "raise":
                raise RuntimeError("planned failure")
            if action == "base":
                raise BASE_EXCEPTIONS[message.attempt % len(BASE_EXCEPTIONS)]("planned")
            if action == "retry":
                raise Retry(delay=0.02, reason="planned retry")
            if action == "retry_bad":
                raise _bad_retry(message)
            if action == "reject":
                raise Reject("planned reject")
            if action == "slow":
                time.sleep(SLOW_SECONDS)
                status = "ack"
        finally:
            run = Run(
                message.queue,
                message.id,
                message.payload["gen"],
                message.attempt,
                message.due_ms,
                started,
                time.time() * 1000,
                status,
            )
            with self.ledger.lock:
                self.ledger.runs.append(run)

    # --- driving a run ---------------------------------------------------------------------------

    def schedule(self, name: str, message_id: str, replace: bool = False) -> None:
        plan = self.rng.choices(ACTIONS, WEIGHTS, k=self.rng.randint(1, 4))
        gen = self.ledger.scheduled.get((name, message_id), -1) + 1
        payload = {"plan": plan, "gen": gen}
        delay = self.rng.choice([0, 0, 0.05, 0.2, 0.5])
        result = self.queues[name].schedule(payload, delay=delay, id=message_id, replace=replace)
        if result.created:  # a new message, a replacement or a successor: this gen must run
            self.ledger.scheduled[(name, message_id)] = gen
        else:
            assert not replace, f"seed {self.seed}: replace=True created nothing: {result}"
            assert result.state, f"seed {self.seed}: refused without a state: {result}"

    def run(self, consumers: int = 2) -> None:
        workers = [
            _Exploring(self, list(self.queues.values()), self.handle) for _ in range(consumers)
        ]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        ids = [(self.rng.choice(QUEUES), f"m{i}") for i in range(self.count)]
        for name, message_id in ids[: self.count // 2]:
            self.schedule(name, message_id)
        for t in threads:
            t.start()
        for name, message_id in ids[self.count // 2 :]:
            self.schedule(name, message_id)
            self._race(ids)
        self._unpause_all()
        drained = self._wait_drained()
        for w in workers:
            w.request_stop()
        for t in threads:
            t.join(60)
        assert drained, f"seed {self.seed}: not drained in {DRAIN_SECONDS}s: {self._counts()}"
        assert not any(t.is_alive() for t in threads), f"seed {self.seed}: a consumer wedged"

    def _race(self, ids: list[tuple[str, str]]) -> None:
        """One random action racing the deliveries, then a short pause."""
        r = self.rng
        name, message_id = r.choice(ids)
        q = self.queues[name]
        kind = r.choices(
            ["cancel", "reschedule", "replace", "requeue", "purge", "edit", "kill", "seq", "none"],
            [10, 6, 8, 5, 3, 6, 3, 1, 20],
        )[0]
        self.log.append(f"{kind} {name} {message_id}")
        if kind == "cancel":
            removed = q.cancel(message_id)
            if removed:
                with self.ledger.lock:
                    self.ledger.cancelled[name] += removed
                    self.ledger.cancelled_ids.add((name, message_id))
        elif kind == "reschedule":
            self.schedule(name, message_id)
        elif kind == "replace":
            self.schedule(name, message_id, replace=True)
        elif kind == "requeue":
            q.requeue(message_id)
        elif kind == "purge":
            if q.purge(message_id):
                self.ledger.purged.add((name, message_id))
        elif kind == "edit":
            self.edits[name] = q.settings.replace(
                visibility_timeout=r.choice([1, 2]),
                paused=r.random() < 0.3,
                max_attempts=r.randint(MAX_ATTEMPTS_LOW, MAX_ATTEMPTS_HIGH),
                concurrency=r.randint(1, 3),
            )
        elif kind == "kill":
            self.client.client_kill_filter(_type="normal", skipme=True)
            self.client.client_kill_filter(_type="pubsub", skipme=True)
        elif kind == "seq":
            self._unreadable_counter_for_a_while(q)
        time.sleep(r.choice([0, 0.01, 0.05, 0.1]))

    def _unreadable_counter_for_a_while(self, q: Queue) -> None:
        saved = self.client.get(q.keys.seq) or b"0"
        self.client.set(q.keys.seq, "not a number")
        time.sleep(0.3)
        self.client.set(q.keys.seq, int(saved) + 1_000_000)  # tokens never repeat

    def _unpause_all(self) -> None:
        for name, q in self.queues.items():
            self.edits[name] = q.settings.replace(paused=False)

    def _counts(self) -> dict[str, dict[str, int]]:
        return {name: q.counts() for name, q in self.queues.items()}

    def _wait_drained(self) -> bool:
        deadline = time.monotonic() + DRAIN_SECONDS
        waiting = ("pending", "ready", "unack", "retry")
        while time.monotonic() < deadline:
            if all(sum(c[s] for s in waiting) == 0 for c in self._counts().values()):
                return True
            time.sleep(0.05)
        return False

    # --- the verdict -----------------------------------------------------------------------------

    def check(self) -> None:
        ledger, fail = self.ledger, f"seed {self.seed}"
        for name, q in self.queues.items():
            journal = _journal(self.client, q)
            self._check_last_attempts(name, journal)
            rows = Counter(
                (row[0], row[5], _as_handled(row)) for row in journal if row[6] != "cancel"
            )
            runs = Counter((r.id, r.attempt, r.status) for r in ledger.runs if r.queue == name)
            assert rows == runs, f"{fail}: {name}: journal {rows - runs} vs handlers {runs - rows}"
            cancels = sum(1 for row in journal if row[6] == "cancel")
            assert cancels == ledger.cancelled[name], f"{fail}: {name}: cancel rows {cancels}"
            for message_id, reason in self.client.hgetall(q.keys.reasons).items():
                if self.client.zscore(q.keys.garbage, message_id) is not None:
                    assert reason, f"{fail}: {name}: {message_id!r} dead without a reason"
            for message_id in self.client.zrange(q.keys.garbage, 0, -1):
                reason = self.client.hget(q.keys.reasons, message_id)
                assert reason, f"{fail}: {name}: {message_id!r} dead without a reason"
            assert self.client.hlen(q.keys.messages) == q.counts()["garbage"], fail
        for (name, message_id), gen in ledger.scheduled.items():
            self._check_fate(name, message_id, gen)
        early = [r for r in ledger.runs if r.started_ms < r.due_ms]
        assert not early, f"{fail}: started before due: {early[:3]}"
        by_id: dict[tuple[str, str], list[Run]] = {}
        for r in ledger.runs:
            by_id.setdefault((r.queue, r.id), []).append(r)
        for key, runs in by_id.items():
            runs.sort(key=lambda r: r.started_ms)
            for a, b in itertools.pairwise(runs):
                assert b.started_ms >= a.finished_ms, f"{fail}: {key} ran twice at once: {a} {b}"

    def _check_last_attempts(self, name: str, journal: list[list[Any]]) -> None:
        """A failed attempt reads "garbage" exactly when it was the last one: max_attempts is
        edited at random while handlers run, so the bounds of every setting used are what the
        oracle knows (a retry row never at 4 or more attempts, a buried one never before 2)."""
        fail = f"seed {self.seed}: {name}"
        for row in journal:
            attempt, outcome, error = row[5], row[6], row[7]
            if outcome == "retry":
                assert attempt < MAX_ATTEMPTS_HIGH, f"{fail}: retry row at the last attempt {row}"
            elif outcome == "garbage" and error != "Reject":
                assert attempt >= MAX_ATTEMPTS_LOW, f"{fail}: buried with attempts left {row}"

    def _check_fate(self, name: str, message_id: str, gen: int) -> None:
        """The latest message of an id was acknowledged, is dead, or was cancelled or purged."""
        q, key = self.queues[name], (name, message_id)
        runs = [r for r in self.ledger.runs if (r.queue, r.id, r.gen) == (name, message_id, gen)]
        acked = any(r.status == "ack" for r in runs)
        dead = self.client.zscore(q.keys.garbage, message_id) is not None
        removed = key in self.ledger.cancelled_ids or key in self.ledger.purged
        assert acked or dead or removed, (
            f"seed {self.seed}: {name}/{message_id} generation {gen} lost: "
            f"runs {[(r.attempt, r.status) for r in runs]}"
        )


def _as_handled(row: list[Any]) -> str:
    """The outcome the handler saw: a failure buried for want of attempts was a failed attempt
    (only Reject is the handler's own "garbage")."""
    return "retry" if row[6] == "garbage" and row[7] != "Reject" else row[6]


class _Exploring(Consumer):
    def __init__(self, exploration: Exploration, queues: list[Queue], handler: Callable) -> None:
        # Each consumer has Queue objects of its own (as separate processes would), fed the
        # same settings edits through refresh(), as the Django worker is from the admin.
        own = [Queue(q.client, q.name, settings=q.settings, clock=q.clock) for q in queues]
        super().__init__(own, handler, idle_seconds=0.1, maintenance_seconds=0.1)
        self.exploration = exploration

    def refresh(self) -> None:
        for q in self.queues:
            edited = self.exploration.edits.get(q.name)
            if edited is not None:
                q.settings = edited


def _journal(client: redis.Redis, q: Queue) -> list[list[Any]]:
    return [row for _, fields in client.xrange(q.keys.journal) for row in json.loads(fields[b"o"])]
