"""Where one queue lives, and what every side of it reads: one object, shared by the sides.

:class:`~django_delayqueue.core.queue.Queue` builds one :class:`QueuePlace` and gives it to each
of its parts (scheduling, bulk, delivery, inspection, housekeeping, task records). The queue's
settings, its client and its share of a sharded queue's limits change at run time (the admin's
overrides, ``ShardedQueue``): they live here alone, so every part reads the current ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.settings import QueueSettings

if TYPE_CHECKING:
    from django_delayqueue.core.clock import Clock
    from django_delayqueue.core.replication import ReplicaAck

# Producers announce a new message on the wake channel only when it is due within this long
# (and earlier than every pending one); consumers never sleep longer than this without reading
# the pending head, so later messages are found without an announcement (see schedule.lua).
ANNOUNCE_WITHIN_MS = 2000


class QueuePlace:
    """One queue's client, names, keys, clock, replicas, shard count and current settings."""

    __slots__ = (
        "announce_args",
        "client",
        "clock",
        "keys",
        "logical_name",
        "name",
        "replicas",
        "settings",
        "shard_count",
    )

    def __init__(
        self,
        client: RedisClient,
        name: str,
        logical_name: str,
        keys: QueueKeys,
        clock: Clock,
        settings: QueueSettings,
        *,
        replicas: ReplicaAck | None = None,
        shard_count: int = 1,
    ) -> None:
        self.client = client
        # One shard of a sharded queue (core.sharding) is named "<queue>#<shard>": what the
        # consumer, its heartbeats and its journal call it. The handlers see ``logical_name``.
        self.name = name
        self.logical_name = logical_name
        self.keys = keys
        self.clock = clock
        self.settings = settings  # replaced whole when staff edit them: read it at each use
        # MIN_REPLICAS: schedules (and the consumer's acks) wait for this many replicas.
        self.replicas = replicas
        # A shard keeps its share of the queue's flow limits (core/flow_limits.py).
        self.shard_count = shard_count
        # What schedule.lua, replace.lua, ack.lua, nack.lua and reap.lua take after the time:
        # when and where to announce a message that falls due soon.
        self.announce_args: tuple[int, str] = (ANNOUNCE_WITHIN_MS, keys.wake_channel)

    def confirm_replicas(self, what: str, result: Any = None) -> None:
        """With ``replicas``: return once they have every write of this queue so far, else
        raise :class:`~.errors.NotReplicated` (carrying ``result``). Without: return at once."""
        if self.replicas is not None:
            where = f"queue {self.name}: {what}"
            self.replicas.confirm(self.client, self.keys.replicated, where, result)
