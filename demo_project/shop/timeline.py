"""The shop page's live timeline: what was scheduled and what was delivered, with lateness.

Read from what the queues keep in Redis, nothing of the shop's own: each queue's delivery
journal (one row per handler run and per cancel, written by the consumers: started, finished,
due, attempt, outcome, how long a flow limit held it) for the last minute, and the messages
due in the next half minute (pending and retrying). Times are the Redis server's, the clock
the due times are kept on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from django_delayqueue.api import get_queue
from django_delayqueue.conf.settings import queue_names
from django_delayqueue.core import DelayQueueError
from django_delayqueue.core.envelope import to_str

PAST_MS = 60_000  # the timeline shows the last minute...
AHEAD_MS = 30_000  # ...and what is due in the next half minute
JOURNAL_ENTRIES = 60  # newest journal entries read per queue (one per consumer batch)
UPCOMING = 40  # waiting messages read per queue and state
LATEST = 14  # rows of the table under the chart
# Exceptions that mean the handler was stopped (its time limit, an abort), not that it failed.
STOPPED = frozenset({"TimeLimitExceeded", "Aborted"})

# What each kind of event is called on the page.
LABELS = {
    "ack": "delivered",
    "retry": "failed, retried",
    "garbage": "dead letter",
    "stopped": "stopped at its time limit",
    "cancel": "cancelled",
    "due": "scheduled",
}


@dataclass(frozen=True)
class Event:
    queue: str
    message_id: str
    kind: str  # a key of LABELS
    at_ms: int  # when it happened (a run: its start), or when it is due ("due")
    attempt: int | None = None
    late_ms: int | None = None  # a first attempt's start minus its due time, less limit wait
    waited_ms: int = 0  # how long a flow limit held it back
    ran_ms: int | None = None  # how long the handler ran
    error: str = ""

    @property
    def label(self) -> str:
        return LABELS[self.kind]


@dataclass
class Timeline:
    now_ms: int
    queues: list[str]
    events: list[Event] = field(default_factory=list)  # oldest first
    errors: list[str] = field(default_factory=list)

    def latest(self, n: int = LATEST) -> list[dict[str, Any]]:
        """The ``n`` newest events that happened (newest first), each with how long ago."""
        done = [e for e in self.events if e.kind != "due" and e.at_ms <= self.now_ms]
        return [
            {"event": e, "ago": f"{(self.now_ms - e.at_ms) / 1000:.1f} s ago"}
            for e in done[::-1][:n]
        ]

    def upcoming(self) -> list[Event]:
        return [e for e in self.events if e.kind == "due"]


def read_timeline(queues: Iterable[str] | None = None) -> Timeline:
    """The events of ``queues`` (default: every configured queue) around now."""
    names = list(queue_names() if queues is None else queues)
    now: int | None = None
    events: list[Event] = []
    errors: list[str] = []
    for name in names:
        try:
            q = get_queue(name)
            if now is None:
                now = q.clock.now_ms()
            for shard in q.shards:
                events += _journal_events(name, shard.client, shard.keys.journal, now)
                for state in ("pending", "retry"):
                    key = getattr(shard.keys, state)
                    events += _upcoming(name, shard.client, key, now)
        except (DelayQueueError, redis.RedisError) as e:  # the page still renders
            errors.append(f"{name}: {e}")
    now = 0 if now is None else now
    events.sort(key=lambda e: e.at_ms)
    return Timeline(now, names, events, errors)


def _journal_events(queue: str, client: Any, stream: str, now: int) -> list[Event]:
    out = []
    for entry_id, fields in client.xrevrange(stream, count=JOURNAL_ENTRIES):
        written = int(to_str(entry_id).split("-")[0])
        if written < now - PAST_MS:
            break
        raw = fields.get(b"o") or fields.get("o") or "[]"
        try:
            rows = json.loads(raw)
        except ValueError:
            continue
        for row in rows:
            event = _row_event(queue, row, written)
            if event is not None and event.at_ms >= now - PAST_MS:
                out.append(event)
    return out


def _row_event(queue: str, row: Any, written: int) -> Event | None:
    """One journal row (core.journal.JOURNAL_FIELDS) as an event."""
    if not isinstance(row, list) or len(row) < 8:
        return None
    message_id, _scheduled, due, started, finished, attempt, outcome, error = row[:8]
    waited = int(row[8] or 0) if len(row) > 8 else 0
    if outcome == "cancel":
        return Event(queue, str(message_id), "cancel", int(finished or written))
    if started is None:
        return None
    kind = "stopped" if error in STOPPED else str(outcome)
    if kind not in LABELS:
        return None
    late = None
    if attempt == 1 and due is not None:
        late = max(0, int(started) - int(due) - waited)
    ran = None if finished is None else max(0, int(finished) - int(started))
    return Event(
        queue, str(message_id), kind, int(started), attempt, late, waited, ran, str(error or "")
    )


def _upcoming(queue: str, client: Any, key: str, now: int) -> list[Event]:
    found = client.zrangebyscore(key, now, now + AHEAD_MS, start=0, num=UPCOMING, withscores=True)
    return [Event(queue, to_str(i), "due", int(score)) for i, score in found]


# --- drawing ---------------------------------------------------------------------------------

WIDTH = 900  # the chart's own units (it scales to the page)
LABEL_WIDTH = 130
LANE = 26
TOP = 22


def chart(timeline: Timeline) -> dict[str, Any]:
    """What the template draws: a lane per queue from a minute ago to half a minute ahead, a
    mark per event (filled: ran, hollow: due), the "now" line and the time ticks."""
    span = PAST_MS + AHEAD_MS
    start = timeline.now_ms - PAST_MS
    plot = WIDTH - LABEL_WIDTH - 10

    def x(ms: int) -> float:
        return round(LABEL_WIDTH + plot * (ms - start) / span, 1)

    lanes = {name: i for i, name in enumerate(timeline.queues)}
    marks = [
        {
            "x": x(e.at_ms),
            "y": TOP + LANE * lanes[e.queue] + LANE / 2,
            "kind": e.kind,
            "title": _title(e, timeline.now_ms),
        }
        for e in timeline.events
        if e.queue in lanes and start <= e.at_ms <= timeline.now_ms + AHEAD_MS
    ]
    ticks = [
        {"x": x(timeline.now_ms + s * 1000), "label": "now" if s == 0 else f"{s:+d} s"}
        for s in range(-60, 31, 15)
    ]
    return {
        "width": WIDTH,
        "height": TOP + LANE * len(lanes) + 6,
        "label_width": LABEL_WIDTH,
        "lanes": [
            {"name": name, "y": TOP + LANE * i + LANE / 2, "top": TOP + LANE * i}
            for name, i in lanes.items()
        ],
        "marks": marks,
        "ticks": ticks,
        "now_x": x(timeline.now_ms),
        "right": WIDTH - 10,
    }


def _title(e: Event, now: int) -> str:
    if e.kind == "due":
        return f"{e.queue} {e.message_id}: due in {max(0, e.at_ms - now) / 1000:.1f} s"
    text = f"{e.queue} {e.message_id}: {e.label}"
    if e.late_ms is not None:
        text += f", started {e.late_ms} ms after its due time"
    if e.waited_ms:
        text += f", held {e.waited_ms} ms by a flow limit"
    return text
