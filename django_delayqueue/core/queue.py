"""One delayed-message queue on Redis: every state change is one Lua script.

:class:`Queue` is put together from one mixin per side of it, each in its own module:
``scheduling.py`` (the producer: one message), ``bulk.py`` (many messages), ``delivery.py``
(the consumer's transitions), ``inspection.py`` (counts, peek, stats), ``housekeeping.py``
(cancel, run now, requeue, purge) and ``task_records.py`` (a task's result record).
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.bulk import (
    DEFAULT_CHUNK as DEFAULT_CHUNK,  # re-exported: the Spark job reads it here
)
from django_delayqueue.core.bulk import BulkScheduling
from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock, RedisClock
from django_delayqueue.core.delivery import MAX_CLAIM as MAX_CLAIM  # re-exported
from django_delayqueue.core.delivery import Delivery
from django_delayqueue.core.due_times import MAX_DUE_MS as MAX_DUE_MS  # re-exported
from django_delayqueue.core.housekeeping import Housekeeping
from django_delayqueue.core.inspection import Inspection
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.replication import ReplicaAck
from django_delayqueue.core.scheduling import SEND_TOKEN_MEMORY_MS as SEND_TOKEN_MEMORY_MS
from django_delayqueue.core.scheduling import Scheduling
from django_delayqueue.core.scripts.contracts import REPLACE, SCHEDULE, SCHEDULE_UNIQUE
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.core.task_records import TaskRecords

# Producers announce a new message on the wake channel only when it is due within this long
# (and earlier than every pending one); consumers never sleep longer than this without reading
# the pending head, so later messages are found without an announcement (see schedule.lua).
ANNOUNCE_WITHIN_MS = 2000


class Queue(Scheduling, BulkScheduling, Delivery, Inspection, Housekeeping, TaskRecords):
    """A named queue. Thread-safe as far as the redis-py client is (a pool per client)."""

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        prefix: str = "dq",
        settings: QueueSettings | None = None,
        clock: Clock | None = None,
        journal_maxlen: int = 100_000,
        replicas: ReplicaAck | None = None,
        shard: int | None = None,
        shards: int = 1,
    ) -> None:
        self.client = client
        # MIN_REPLICAS: schedules (and the consumer's acks) wait for this many replicas.
        self.replicas = replicas
        # One shard of a sharded queue (core.sharding) is named "<queue>#<shard>": what the
        # consumer, its heartbeats and its journal call it. The handlers see ``logical_name``.
        self.logical_name = name
        self.name = name if shard is None else f"{name}#{shard}"
        self.keys = QueueKeys(prefix, name, shard)
        # A shard keeps its share of the queue's flow limits (core/flow_limits.py).
        self.shard_count = 1 if shard is None else shards
        self.settings = settings or QueueSettings()
        self.clock = clock or RedisClock(client)
        # schedule() is the hot path of every producer: its keys are bound once. replace=True
        # has a script of its own, so that path stays as lean as it was.
        self._schedule_one = SCHEDULE.bind(client, self.keys)
        self._replace_one = REPLACE.bind(client, self.keys)
        self._schedule_unique = SCHEDULE_UNIQUE.bind(client, self.keys)  # unique_for=
        # What schedule.lua and replace.lua take after the time: when and where to announce.
        self.announce_args: tuple[int, str] = (ANNOUNCE_WITHIN_MS, self.keys.wake_channel)
        self.journal_maxlen = journal_maxlen  # cap of the journal stream cancels write to
        self.newer_said: set[int] = set()  # see Delivery.leave_for_newer

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} {self.keys.tag}>"

    # A queue is its own only shard: callers that route by id (core.sharding) need not care.
    @property
    def shards(self) -> list[Queue]:
        return [self]

    def shard_for(self, message_id: str) -> Queue:
        """The queue that holds (or would hold) ``message_id``: this one."""
        return self

    def keys_for(self, message_id: str) -> QueueKeys:
        """The keys of the queue holding ``message_id`` (its task record, say)."""
        return self.keys

    def confirm_replicas(self, what: str, result: Any = None) -> None:
        """With ``replicas``: return once they have every write of this queue so far, else
        raise :class:`~.errors.NotReplicated` (carrying ``result``). Without: return at once."""
        if self.replicas is not None:
            where = f"queue {self.name}: {what}"
            self.replicas.confirm(self.client, self.keys.replicated, where, result)
