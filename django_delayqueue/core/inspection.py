"""The read-only side of a queue: counts, how overdue it is, pages of messages, activity.

A part of :class:`~django_delayqueue.core.queue.Queue`, given the queue's
:class:`~.queue_place.QueuePlace`; kept apart because it changes nothing in Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.envelope import decode_envelope_parts, to_str
from django_delayqueue.core.errors import ConfigurationError, CorruptEnvelope
from django_delayqueue.core.flow_limits import key_claim_spec
from django_delayqueue.core.keys import STATES
from django_delayqueue.core.progress import Progress, decode_progress
from django_delayqueue.core.results import Page, PeekedMessage, Snapshot
from django_delayqueue.core.scripts.calls import ScriptBatch, ScriptCall, redis_errors
from django_delayqueue.core.scripts.contracts import (
    BUSIEST_KEYS,
    COUNTS,
    FLOW_STATE,
    NEWER_WAITING,
    OVERDUE,
    PEEK,
    STATS,
)
from django_delayqueue.core.timings.reading import read_call as timings_call

if TYPE_CHECKING:
    from django_delayqueue.core.queue import Queue
    from django_delayqueue.core.queue_place import QueuePlace

MAX_PAGE = 1000  # most messages one peek may return


class Inspection:
    """What one queue holds, read without changing anything."""

    def __init__(self, place: QueuePlace) -> None:
        self.place = place

    def counts_call(self, now_ms: int) -> ScriptCall:
        """counts.lua at ``now_ms``: keyed ready messages their key's limits do not hold back
        count as overdue too (the key limits are the queue's settings)."""
        return COUNTS.call(self.place.keys, now_ms=now_ms, key_limits=self._key_limits())

    def overdue_call(self, now_ms: int) -> ScriptCall:
        """overdue.lua at ``now_ms``: how many pending and retrying messages are due, and how
        many keyed ready messages their key's limits let go now (by counts.lua's rule)."""
        return OVERDUE.call(self.place.keys, now_ms=now_ms, key_limits=self._key_limits())

    def _key_limits(self) -> str:
        """The flow keys' limits as counts.lua and overdue.lua read them ('': none)."""
        s = self.place.settings
        return key_claim_spec(s.key_concurrency, s.key_rate_limit) if s.key_limited else ""

    def activity_call(
        self, alive_since_ms: int, most_entries: int, most_consumers: int
    ) -> ScriptCall:
        """``stats.lua``: delivery totals (tallying at most ``most_entries`` new journal
        entries), the consumers seen since ``alive_since_ms`` (at most ``most_consumers``
        listed) and the settings published to Redis; its reply is described in the script."""
        return STATS.call(
            self.place.keys,
            most_entries=most_entries,
            alive_since_ms=alive_since_ms,
            most_consumers=most_consumers,
        )

    def counts(self) -> dict[str, int]:
        """How many messages are in each state."""
        return self.snapshot().counts

    def snapshot(self, now_ms: int | None = None) -> Snapshot:
        now = self.place.clock.now_ms() if now_ms is None else now_ms
        return self.snapshot_result(self.counts_call(now).run(self.place.client), now)

    def snapshot_result(self, raw: Sequence[Any], now_ms: int) -> Snapshot:
        values = [int(x) for x in raw]
        counts: dict[str, int] = dict(zip(STATES, values[:5], strict=False))
        first_pending, first_retry, ready_due = values[5:8]
        overdue = [t for t in (first_pending, first_retry, ready_due) if 0 <= t <= now_ms]
        upcoming = [t for t in (first_pending, first_retry) if t >= 0]
        return Snapshot(
            self.place.name,
            counts,
            now_ms - min(overdue) if overdue else None,
            min(upcoming) if upcoming else None,
        )

    def progress_of(self, *message_ids: str) -> dict[str, Progress]:
        """The progress the running deliveries of ``message_ids`` reported, by id (an id
        without one is left out: not running, or it reported none)."""
        if not message_ids:
            return {}
        with redis_errors("reading progress"):
            values = self.place.client.hmget(self.place.keys.progress, list(message_ids))
        found = {i: decode_progress(v) for i, v in zip(message_ids, values, strict=True)}
        return {i: p for i, p in found.items() if p is not None}

    def scheduled_times(self, message_ids: Sequence[str]) -> dict[str, int]:
        """The scheduled time (ms) of each message of ``message_ids`` this queue still holds,
        in any state, by id (a message it does not hold is left out; one whose envelope
        cannot be read counts as held at -1)."""
        if not message_ids:
            return {}
        with redis_errors("reading envelopes"):
            values = self.place.client.hmget(self.place.keys.messages, list(message_ids))
        out: dict[str, int] = {}
        for message_id, raw in zip(message_ids, values, strict=True):
            if raw is None:
                continue
            try:
                out[message_id] = decode_envelope_parts(raw).scheduled_ms
            except CorruptEnvelope:  # a newer format, or corrupt: still there, kept
                out[message_id] = -1
        return out

    def peek(self, state: str, offset: int = 0, limit: int = 50) -> Page:
        """One page of messages in ``state`` (pending, ready, unack, retry or garbage)."""
        if state not in STATES:
            raise ConfigurationError(f"unknown state {state!r}; use one of {', '.join(STATES)}")
        if not (offset >= 0 and 1 <= limit <= MAX_PAGE):
            raise ConfigurationError(f"peek needs offset >= 0 and 1 <= limit <= {MAX_PAGE}")
        raw = PEEK.call(self.place.keys, state=state, offset=offset, limit=limit).run(
            self.place.client
        )
        rows = [
            PeekedMessage(
                id=to_str(raw[i]),
                state=state,
                score_ms=int(float(raw[i + 1])) if raw[i + 1] not in (b"", "") else None,
                envelope=to_str(raw[i + 2]),
                attempts=int(raw[i + 3]),
                reason=to_str(raw[i + 4]),
            )
            for i in range(1, len(raw), 5)
        ]
        return Page(int(raw[0]), rows)


def snapshots(queues: Sequence[Queue], now_ms: int | None = None) -> list[Snapshot]:
    """Snapshots of many queues in one round trip (they must share one client)."""
    if not queues:
        return []
    batch = ScriptBatch()
    now = queues[0].clock.now_ms() if now_ms is None else now_ms
    for q in queues:
        batch.add(q.counts_call(now))
    return [
        q.snapshot_result(raw, now)
        for q, raw in zip(queues, batch.run(queues[0].client), strict=False)
    ]


def counts_and_activity(
    queues: Sequence[Queue],
    alive_since_ms: int,
    most_entries: int,
    most_consumers: int,
    now_ms: int = 0,
    busiest_top: int = 10,
    most_newer: int = 1000,
) -> list[tuple[Any, Any, Any, Any, Any, Any, Any]]:
    """The replies of :meth:`~Inspection.counts_call`, :meth:`~Inspection.activity_call`,
    the flow limits' state (flow_state.lua, at ``now_ms``), the delivery timings
    (core.timings.reading, as of ``now_ms``), the busiest flow keys (busiest_keys.lua:
    the top ``busiest_top``), the messages waiting for a newer consumer (newer_waiting.lua,
    looking at ``most_newer`` entries) and the overdue backlog (overdue.lua, at ``now_ms``) of
    each of ``queues`` (which share one client), in one round trip: a script's error is
    returned in its place; DelayQueueError when the round trip fails."""
    batch = ScriptBatch()
    for q in queues:
        batch.add(q.counts_call(now_ms))
        batch.add(q.activity_call(alive_since_ms, most_entries, most_consumers))
        batch.add(FLOW_STATE.call(q.keys, now_ms=now_ms))
        batch.add(timings_call(q.keys, now_ms))
        batch.add(BUSIEST_KEYS.call(q.keys, top=busiest_top))
        batch.add(NEWER_WAITING.call(q.keys, most_entries=most_newer))
        batch.add(q.overdue_call(now_ms))
    results = batch.run(queues[0].client, raise_errors=False) if queues else []
    per_queue = 7
    return [
        (
            results[per_queue * i],
            results[per_queue * i + 1],
            results[per_queue * i + 2],
            results[per_queue * i + 3],
            results[per_queue * i + 4],
            results[per_queue * i + 5],
            results[per_queue * i + 6],
        )
        for i in range(len(queues))
    ]
