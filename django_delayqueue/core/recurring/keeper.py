"""Keeps recurring schedules going from inside the consumer: no beat process.

Each consumer round, for the queues it serves, the keeper adds to the round's pipeline an
``advance_recurrence.lua`` call for every schedule whose latest tick is due (or that is new,
edited, paused or deleted), computed by :func:`~.planning.plan_ticks`. The script creates the
ticks only if the schedule's state is still what this consumer saw, so any number of consumers
race safely: one creates the ticks, the others are told the new state. States are read once
at the start and again at each maintenance (``refresh``), and corrected by every reply.

The consumer sees the keeper through a small interface
(:class:`~django_delayqueue.core.consumer.rounds.parts.Keeper`): its calls and replies in each
round (:meth:`ScheduleKeeper.add_to`, :meth:`ScheduleKeeper.read`), when it needs a round, and
what a finished tick leaves to write (:meth:`ScheduleKeeper.finished`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.envelope import encode_envelope, encode_payload
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.recurring.planning import (
    RecurrenceState,
    TickPlan,
    forget_tombstone,
    plan_ticks,
)
from django_delayqueue.core.recurring.recurrence import Recurrence, parse_tick_id
from django_delayqueue.core.scripts.calls import ScriptBatch, ScriptCall
from django_delayqueue.core.scripts.contracts import (
    ADVANCE_RECURRENCE,
    RECORD_TICK,
    RECURRENCE_STATES,
)

if TYPE_CHECKING:  # the consumer's package imports a keeper's interface, never this module
    from django_delayqueue.core.consumer.outcomes import Outcome

logger = logging.getLogger(__name__)

# What a tick carries: by default the schedule's payload; the Django layer builds a task's.
# How long a queue (or a schedule) whose calls fail is left alone: less than LATE_GRACE_MS,
# so that a tick delayed by one failed call is late, never missed.
FAILED_PAUSE_MS = 1000
# A keeper whose rounds stopped this long (every Redis call failing, the process stuck) was not
# running: ticks due during the gap were missed, and meet their catch-up policy.
RUNNING_GAP_MS = 30_000
TOMBSTONE_DAYS_MS = 86_400_000  # a deleted schedule's tombstone is forgotten after a day
PayloadFor = Callable[[Recurrence, int], Any]
# A tick's flow key: by default the schedule's ``key``; the Django layer reads a task's too.
KeyFor = Callable[[Recurrence], "str | None"]
Entry = tuple[Queue, str, int, Any]  # queue, kind ("states" | "advance"), index, detail


def schedule_payload(recurrence: Recurrence, instant_ms: int) -> Any:
    return recurrence.payload


def schedule_key(recurrence: Recurrence) -> str | None:
    return recurrence.key


class ScheduleKeeper:
    """The recurring schedules of a consumer's queues, and their states as last seen."""

    def __init__(
        self, payload_for: PayloadFor = schedule_payload, key_for: KeyFor = schedule_key
    ) -> None:
        self.payload_for = payload_for
        self.key_for = key_for
        # Ticks refused because Redis is full are logged here once (the consumer shares its own).
        self.memory = OutOfMemoryLog(logger)
        self.version = 0
        self._by_queue: dict[str, dict[str, Recurrence]] = {}  # Queue.name -> name -> schedule
        # Queue.name -> name -> state as stored (bytes: compared byte for byte by the script)
        self._states: dict[str, dict[str, bytes | str]] = {}
        self._stale: set[str] = set()  # queues whose states must be read again
        self._failed_until: dict[str, int] = {}  # queue -> when to try a failing queue again
        self._changed: set[str] = set()  # queues whose states changed: plan them next round
        self._unreadable: frozenset[str] = frozenset()  # published, but not readable here
        self._broken: dict[tuple[str, str], int] = {}  # (queue, schedule) -> retry after (ms)
        # (queue, schedule) -> the failure logged at ERROR: tried again every FAILED_PAUSE_MS,
        # but said once, not every second, until it succeeds or fails otherwise.
        self._reported: dict[tuple[str, str], str] = {}
        self._running_since: int | None = None  # first round of the current unbroken run
        self._last_round: int | None = None
        self._authoritative = True  # may delete what it does not define (see set_definitions)
        self.loaded = False  # definitions given at least once

    # --- definitions -----------------------------------------------------------------------------

    def set_definitions(
        self,
        recurrences: Iterable[Recurrence],
        queues: Sequence[Queue],
        version: int = 0,
        unreadable: Iterable[str] = (),
        authoritative: bool = True,
    ) -> None:
        """Serve ``recurrences`` whose queue is one of ``queues`` (a sharded queue's schedule
        lives on the shard its name maps to); states are read again with the next round.

        ``unreadable`` names schedules that are published but that this process cannot read
        (an option of a newer release, a time zone it lacks): they are left alone, never taken
        for deleted. ``authoritative=False`` (definitions from the settings file alone, the
        published ones being unavailable) deletes nothing it does not define.
        """
        from django_delayqueue.core.sharding import shard_index  # it imports this package

        shards: dict[str, list[Queue]] = {}
        for q in queues:
            shards.setdefault(q.logical_name, []).append(q)
        for group in shards.values():
            group.sort(key=lambda q: q.keys.shard or 0)
        by_queue: dict[str, dict[str, Recurrence]] = {q.name: {} for q in queues}
        for r in recurrences:
            serving = shards.get(r.queue)
            if serving:
                q = serving[shard_index(r.name, len(serving))]
                by_queue[q.name][r.name] = r
        unknown = frozenset(unreadable)
        changed = (
            by_queue != self._by_queue or version != self.version or unknown != self._unreadable
        )
        self._by_queue, self.version, self._unreadable = by_queue, version, unknown
        self._reported = {k: v for k, v in self._reported.items() if k[1] in by_queue.get(k[0], {})}
        self._authoritative, self.loaded = authoritative, True
        if changed:
            self.refresh()

    def refresh(self) -> None:
        """Read every queue's schedule states with the next round (at the start, and when the
        definitions change: between, every reply of the script keeps the states current)."""
        self._stale = set(self._by_queue)

    def holds(self, q: Queue, now_ms: int) -> bool:
        """Whether ``q``'s round must wait for its schedule states (the round that reads them):
        a tick waiting since before an outage must meet its catch-up policy before anything
        promotes and claims it. Not while a failing queue is left alone: it delivers."""
        return q.name in self._stale and self._failed_until.get(q.name, 0) <= now_ms

    def recurrence_of(self, q: Queue, message_id: str) -> tuple[Recurrence, int] | None:
        """The schedule and tick instant of a tick message of ``q``, or None."""
        parsed = parse_tick_id(message_id)
        if parsed is None:
            return None
        recurrence = self._by_queue.get(q.name, {}).get(parsed[0])
        return None if recurrence is None else (recurrence, parsed[1])

    def finished(self, q: Queue, outcome: Outcome) -> ScriptCall | None:
        """A tick of ``q`` ran: its schedule's last run and outcome, to write with the next
        round (None for a message that is no tick of a schedule served here)."""
        tick = self.recurrence_of(q, outcome.message.id)
        if tick is None:
            return None
        status = outcome.journal_row(q.settings.max_attempts)[6]
        run = tick_run(tick[1], outcome.finished_ms, status, outcome.error)
        return record_tick_call(q, tick[0].name, run)

    # --- the round -------------------------------------------------------------------------------

    def add_to(self, batch: ScriptBatch, queues: Sequence[Queue], now_ms: int) -> list[Entry]:
        """Add this round's reads and advances for ``queues`` to ``batch``."""
        entries: list[Entry] = []
        for q in queues:
            if q.name not in self._by_queue or self._failed_until.get(q.name, 0) > now_ms:
                continue
            if q.name in self._stale:
                call = RECURRENCE_STATES.call(q.keys)
                entries.append((q, "states", batch.add(call), None))
                continue  # plans follow the read, next round
            self._changed.discard(q.name)
            for name, plan in self._plans(q, now_ms):
                try:
                    call = self._call(q, name, plan, now_ms)
                except Exception as e:  # a payload that will not encode: never the loop's end
                    self._fail(q, name, f"no tick created: {e}", now_ms)
                    continue
                self._reported.pop((q.name, name), None)
                entries.append((q, "advance", batch.add(call), (name, plan)))
        return entries

    def read(self, entries: list[Entry], results: Sequence[Any], now_ms: int) -> None:
        """Take in the replies of this round's calls (never raises: the round's claims were
        read before, and must reach their handlers whatever a schedule's reply holds)."""
        if self._last_round is None or now_ms - self._last_round > RUNNING_GAP_MS:
            self._running_since = now_ms
        self._last_round = now_ms
        for entry in entries:
            try:
                self._read_one(entry, results[entry[2]], now_ms)
            except Exception:
                q = entry[0]
                logger.exception("queue %s: recurring schedules: unreadable reply", q.name)
                self._stale.add(q.name)
                self._failed_until[q.name] = now_ms + FAILED_PAUSE_MS

    def _read_one(self, entry: Entry, raw: Any, now_ms: int) -> None:
        q, kind, _, detail = entry
        if isinstance(raw, Exception):
            # A broken key (say, of the wrong type): logged, and left alone for a while,
            # never a loop that spins on it; the states are read again after. Redis out of
            # memory: the same, logged once until it has room.
            if not self.memory.check(raw, f"queue {q.name}: recurring ticks"):
                logger.error("queue %s: recurring schedules: %s", q.name, raw)
            self._stale.add(q.name)
            self._failed_until[q.name] = now_ms + FAILED_PAUSE_MS
            return
        self._failed_until.pop(q.name, None)
        if kind == "states":
            names = [_text(v) for v in raw[::2]]
            self._states[q.name] = dict(zip(names, raw[1::2], strict=True))
            self._stale.discard(q.name)
            self._changed.add(q.name)
            return
        name, plan = detail
        known = self._states.setdefault(q.name, {})
        applied, value = int(raw[0]), raw[1]
        if applied and int(value):
            self.memory.taken()  # ticks were written: Redis has room
        if applied:
            self._log_advance(q, name, plan, int(value))
            known[name] = plan.new_state
        else:  # another consumer was first: plan again from the state it left
            self._changed.add(q.name)
            if value:
                known[name] = value
            else:
                known.pop(name, None)

    def next_due(self) -> int | None:
        """When the next round must run for a schedule: the earliest due latest tick."""
        due = [
            max(state.cursor_ms, self._broken.get((q_name, name), 0))
            for q_name, states in self._states.items()
            if q_name not in self._failed_until
            for name, raw in states.items()
            if name in self._by_queue.get(q_name, {})
            and not self._by_queue[q_name][name].paused
            and (state := RecurrenceState.parse(raw)) is not None
            and state.version <= self.version  # else nothing to do before a refresh
        ]
        due.extend(self._failed_until.values())
        return min(due, default=None)

    def needs_round(self, now_ms: int) -> bool:
        """States to read, or a change to make: the next round should not wait."""
        pending = self._changed | self._stale
        return any(self._failed_until.get(name, 0) <= now_ms for name in pending)

    # --- internals -------------------------------------------------------------------------------

    def _plans(self, q: Queue, now_ms: int) -> list[tuple[str, TickPlan]]:
        defined = self._by_queue.get(q.name, {})
        known = self._states.get(q.name, {})
        out = []
        for name in {*defined, *known}:
            if name in self._unreadable or self._broken.get((q.name, name), 0) > now_ms:
                continue
            if name not in defined and not self._authoritative:
                continue
            try:
                plan = plan_ticks(
                    defined.get(name), known.get(name), now_ms, self.version, self._running_since
                )
                if plan is None and name not in defined:
                    plan = forget_tombstone(known.get(name), now_ms - TOMBSTONE_DAYS_MS)
            except Exception as e:  # one schedule's computation must never stop the loop
                self._fail(q, name, f"no plan: {e}", now_ms)
                continue
            self._broken.pop((q.name, name), None)
            if plan is not None:
                out.append((name, plan))
            else:
                self._reported.pop((q.name, name), None)
        return sorted(out)

    def _fail(self, q: Queue, name: str, problem: str, now_ms: int) -> None:
        """One schedule failed: left alone for FAILED_PAUSE_MS, then tried again; an error
        logged once (at DEBUG when it repeats), not every second."""
        key = (q.name, name)
        level = logging.DEBUG if self._reported.get(key) == problem else logging.ERROR
        self._reported[key] = problem
        logger.log(level, "queue %s: schedule %s: %s", q.name, name, problem)
        self._broken[key] = now_ms + FAILED_PAUSE_MS

    def _call(self, q: Queue, name: str, plan: TickPlan, now_ms: int) -> ScriptCall:
        recurrence = self._by_queue.get(q.name, {}).get(name)
        triples: list[Any] = []
        if recurrence is not None and plan.instants:
            key = self.key_for(recurrence)
            _check_key_shard(q, name, key)
            for instant in plan.instants:
                payload = encode_payload(
                    self.payload_for(recurrence, instant), q.settings.max_payload_bytes
                )
                # A ``task`` schedule (staff's, from the settings or the admin) sends a task.
                envelope = encode_envelope(
                    payload, instant, min(now_ms, instant), task=bool(recurrence.task), key=key
                )
                triples.extend((recurrence.tick_id(instant), instant, envelope))
        horizon, channel = q.announce_args
        return ADVANCE_RECURRENCE.call(
            q.keys,
            now_ms=now_ms,
            horizon_ms=horizon,
            wake_channel=channel,
            name=name,
            expected=plan.expected,
            new_state=plan.new_state,
            withdraw="2" if plan.forget else "1" if plan.withdraw else "0",
            skips=len(plan.drop),
            skipped_ids=[recurrence.tick_id(t) for t in plan.drop if recurrence is not None],
            triples=triples,
        )

    @staticmethod
    def _log_advance(q: Queue, name: str, plan: TickPlan, created: int) -> None:
        if plan.missed:
            logger.warning(
                "queue %s: schedule %s: %s%d tick(s) missed while no consumer ran were skipped "
                "(catch_up)",
                q.name,
                name,
                "" if plan.missed_exact else "at least ",
                plan.missed,
            )
        if plan.forget:
            logger.info("queue %s: schedule %s removed; its waiting tick withdrawn", q.name, name)
        elif plan.withdraw and not plan.instants:
            logger.info("queue %s: schedule %s paused; its waiting tick withdrawn", q.name, name)
        elif plan.withdraw:
            logger.info("queue %s: schedule %s changed; its waiting tick replaced", q.name, name)
        logger.debug("queue %s: schedule %s: %d tick(s) created", q.name, name, created)


def _check_key_shard(q: Queue, name: str, key: str | None) -> None:
    """ConfigurationError when a keyed schedule's ticks cannot live on ``q``'s shard (the
    checks and the admin refuse such a schedule; one published by hand fails here, logged)."""
    from django_delayqueue.core.sharding import keyed_schedule_problem  # it imports this package

    problem = keyed_schedule_problem(name, key, q.shard_count)
    if problem is not None:
        raise ConfigurationError(problem)


def tick_run(instant_ms: int, finished_ms: int, outcome: str, error: str) -> str:
    return json.dumps(
        {"tick": instant_ms, "finished": finished_ms, "outcome": outcome, "error": error},
        separators=(",", ":"),
    )


def record_tick_call(q: Queue, name: str, run: str) -> ScriptCall:
    return RECORD_TICK.call(q.keys, name=name, run=run)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
