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
from django_delayqueue.core.recurring.planning import RecurrenceState
from django_delayqueue.core.recurring.recurrence import MAX_INSTANT_MS, Recurrence
from django_delayqueue.core.scripts.calls import redis_errors
from django_delayqueue.mirror.recurrences import (
    Invalid,
    declared,
    load_published,
    read_definitions,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecurrenceStatus:
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


def statuses(recurrences: list[Recurrence]) -> list[RecurrenceStatus]:
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
            pipe.hget(k.recurrence_states, r.name)
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
        try:
            out.append(_status(r, state, run, now, error))
        except Exception as e:  # one schedule's status never takes a page down
            logger.warning("schedule %s: no status: %s", r.name, e)
            out.append(_status(r, None, None, now, f"status unavailable: {e}"))
    return out


def invalid_status(name: str, options: Any, error: str) -> RecurrenceStatus:
    """The status of a schedule whose options are invalid: listed, with its problem as the
    error (a row stored past validation, a definition another release published)."""
    values = options if isinstance(options, dict) else {}
    if values.get("cron") is not None:
        when = f"cron {values['cron']}"
    elif values.get("every") is not None:
        when = f"every {values['every']}s"
    else:
        when = "-"
    return RecurrenceStatus(
        name,
        str(values.get("queue") or ""),
        when[:100],
        values.get("paused") is True,
        None,
        False,
        None,
        None,
        "",
        "",
        f"invalid: {error}",
    )


def _status(r: Recurrence, state: Any, run: Any, now: int, error: str) -> RecurrenceStatus:
    parsed = RecurrenceState.parse(state)
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
            if not isinstance(last, dict) or not _instant(last.get("tick")):
                raise ValueError(run)
            if not _instant(last.get("finished")):
                last["finished"] = None
        except ValueError:
            logger.warning("schedule %s: unreadable last run %r", r.name, run)
            last = {}
    return RecurrenceStatus(
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


def _instant(value: Any) -> bool:
    """Whether a last run's instant is one the pages can show (ms, as record_tick writes)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_INSTANT_MS


def configured_statuses() -> list[RecurrenceStatus]:
    """Every schedule as runqueue sees them (published ones, else the rows, else the file),
    by name, each with its status; one whose options are invalid is listed with the reason."""
    recurrences, invalid = _configured()
    out = statuses(recurrences) + [invalid_status(i.name, i.options, i.error) for i in invalid]
    return sorted(out, key=lambda s: s.name)


def _configured() -> tuple[list[Recurrence], list[Invalid]]:
    try:
        published = load_published()
    except DelayQueueError:
        published = None
    if published is not None:
        return published.recurrences, published.invalid
    try:
        from django_delayqueue.models import RecurringSchedule

        rows = list(RecurringSchedule.objects.all())
        if rows:
            return read_definitions({row.name: row.definition() for row in rows})
    except Exception as e:  # no table yet
        logger.debug("recurring schedule rows unavailable: %s", e)
    return read_definitions(declared())
