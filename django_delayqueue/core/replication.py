"""Replica acknowledgement: a write returns only once N replicas have it (``MIN_REPLICAS``).

Redis replicates asynchronously, so a primary that fails over can take its last writes with it.
``WAIT N TIMEOUT`` blocks until N replicas confirmed every write *its own connection* made. A
queue's writes go through pooled connections and pipelines, so rather than tie WAIT to the
connection of each write, :meth:`ReplicaAck.confirm` makes one small write of its own (an INCR of
the queue's ``replicated`` counter) and WAITs on that connection: the replication stream is
ordered, so a replica that has the probe has every write that returned before it, whichever
connection made it. That also covers a schedule that created nothing because an earlier,
unconfirmed attempt had already written the message.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.cluster import RedisCluster

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.errors import ConfigurationError, NotReplicated
from django_delayqueue.core.scripts.calls import redis_errors


@dataclass(frozen=True)
class ReplicaAck:
    """Require ``replicas`` replicas to confirm a write within ``timeout_ms``."""

    replicas: int
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise ConfigurationError(f"MIN_REPLICAS must be a whole number, not {self.replicas!r}")
        if self.replicas < 1:
            raise ConfigurationError(f"MIN_REPLICAS must be 1 or more here, not {self.replicas}")
        if isinstance(self.timeout_ms, bool) or not isinstance(self.timeout_ms, int):
            raise ConfigurationError(
                f"the replica timeout must be whole ms, not {self.timeout_ms!r}"
            )
        if self.timeout_ms < 1:
            raise ConfigurationError(
                f"the replica timeout must be 1 ms or more, not {self.timeout_ms}"
            )

    def confirm(self, client: RedisClient, probe_key: str, what: str) -> int:
        """Return once the replicas have every write that returned before this call; raise
        :class:`NotReplicated` naming ``what`` when too few confirm in time."""
        with redis_errors(f"waiting for replicas ({what})"):
            if isinstance(client, RedisCluster):
                # WAIT names no key: send both to the primary of the queue's slot ourselves.
                client = client.get_node_from_key(probe_key).redis_connection
            pipe = client.pipeline(transaction=False)
            pipe.incr(probe_key)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
            _, acknowledged = pipe.execute()
        if int(acknowledged) < self.replicas:
            raise NotReplicated(
                f"{what}: {acknowledged} of {self.replicas} replica(s) confirmed it within "
                f"{self.timeout_ms} ms; it is on the primary but not safe from a failover yet"
            )
        return int(acknowledged)
