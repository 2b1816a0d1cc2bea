"""Where each recurring schedule stands, read from Redis: what the admin, ``queuestats`` and
the metrics show (next run, last run and its outcome, paused)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from django_delayqueue.conf.connection import get_client, get_clock
from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.recurring.planning import ScheduleState
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.core.scripts.calls import redis_errors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduleStatus:
    name: str
    queue: str
    when: str  # "cron 0 3 * * * (Europe/Berlin)" or "every 300s"
    paused: bool
    next_run_ms: int | None  # the next tick: waiting in Redis, or due to be created
    next_is_waiting: bool  # a runqueue created it (False: no runqueue has yet)
    last_tick_ms: int | None  # the instant of the latest tick that ran
    last_finished_ms: int | None
    last_outcome: str  # ack, retry, garbage, or "" (never ran)
    last_error: str
    error: str = ""  # Redis could not be read

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queue": self.queue,
            "when": self.when,
            "paused": self.paused,
            "next_run_ms": self.next_run_ms,
            "next_is_waiting": self.next_is_waiting,
            "last_tick_ms": self.last_tick_ms,
            "last_finished_ms": self.last_finished_ms,
            "last_outcome": self.last_outcome,
            "last_error": self.last_error,
            "error": self.error,
        }


def statuses(recurrences: list[Recurrence]) -> list[ScheduleStatus]:
    """One status per schedule, read in one round trip (never raises: ``error`` says, per
    schedule: one whose queue is no longer configured does not blank the others)."""
    if not recurrences:
        return []
    keys: list[Any] = []
    for r in recurrences:
        try:
            keys.append(get_queue(r.queue).shard_for(r.name).keys)
        except Exception as e:  # a queue that is not configured (any more)
            keys.append(e)
    readable = [
        (r, k) for r, k in zip(recurrences, keys, strict=True) if not isinstance(k, Exception)
    ]
    try:
        pipe = get_client().pipeline(transaction=False)
        for r, k in readable:
            pipe.hget(k.schedules, r.name)
            pipe.hget(k.tick_runs, r.name)
        with redis_errors("reading recurring schedules"):
            replies = pipe.execute(raise_on_error=False) if readable else []
        now = get_clock().now_ms()
    except Exception as e:  # Redis down
        return [_status(r, None, None, 0, str(e)) for r in recurrences]
    found = {r.name: (replies[2 * i], replies[2 * i + 1]) for i, (r, _) in enumerate(readable)}
    out = []
    for r, k in zip(recurrences, keys, strict=True):
        if isinstance(k, Exception):
            out.append(_status(r, None, None, now, str(k)))
            continue
        state, run = found[r.name]
        error = next((str(x) for x in (state, run) if isinstance(x, Exception)), "")
        if error:
            state = run = None
        out.append(_status(r, state, run, now, error))
    return out


def _status(r: Recurrence, state: Any, run: Any, now: int, error: str) -> ScheduleStatus:
    parsed = ScheduleState.parse(state)
    waiting = parsed is not None and not r.paused and parsed.cursor_ms > now
    if r.paused or error:
        next_run = None
    elif waiting and parsed is not None:
        next_run = parsed.cursor_ms
    else:
        next_run = r.next_after(now)
    last: dict[str, Any] = {}
    if run:
        try:
            last = json.loads(run)
        except ValueError:
            logger.warning("schedule %s: unreadable last run %r", r.name, run)
    return ScheduleStatus(
        r.name,
        r.queue,
        r.describe(),
        r.paused,
        next_run,
        waiting,
        last.get("tick"),
        last.get("finished"),
        str(last.get("outcome") or ""),
        str(last.get("error") or ""),
        error,
    )


def configured_recurrences() -> list[Recurrence]:
    """The schedules as runqueue sees them: published ones, else the rows, else the file."""
    from django_delayqueue.recurring.definitions import declared_recurrences, load_published

    try:
        published = load_published()
    except DelayQueueError:
        published = None
    if published is not None:
        return sorted(published.recurrences, key=lambda r: r.name)
    try:
        from django_delayqueue.models import RecurringSchedule

        rows = list(RecurringSchedule.objects.all())
        if rows:
            return [Recurrence.from_mapping(row.name, row.definition()) for row in rows]
    except Exception as e:  # no table yet
        logger.debug("recurring schedule rows unavailable: %s", e)
    return sorted(declared_recurrences(), key=lambda r: r.name)
