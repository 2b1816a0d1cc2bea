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

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.errors import ConfigurationError, NotReplicated, ScriptFailed
from django_delayqueue.core.scripts.calls import (
    ScriptCall,
    is_noscript,
    is_out_of_memory,
    redis_errors,
    script_error,
)
from django_delayqueue.core.scripts.fast_path import get_connection

# WAIT answers once its own timeout is over: its reply is read with that much and this margin,
# whatever the client's socket_timeout (redis-py 8 defaults it to 5 s; ours is 30 s), which
# would otherwise cut a longer MIN_REPLICAS_TIMEOUT_SECONDS short.
WAIT_READ_MARGIN_SECONDS = 5.0


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

    def run(self, client: RedisClient, call: ScriptCall, probe_key: str, what: str) -> Any:
        """Run ``call``, then the probe and WAIT, on one connection in one round trip, and
        return the script's reply once the replicas confirmed it (else :class:`NotReplicated`).

        One connection, and without redis-py's retries: a check sent apart, or retried, could
        reconnect to a newly promoted replica and confirm there a write that died with the old
        primary.
        """
        with redis_errors(f"{call.script.name} with replica acknowledgement ({what})"):
            node = _node_client(client, probe_key)
            script, keys, args = call
            commands = [
                ("EVALSHA", script.sha, len(keys), *keys, *args),
                ("INCR", probe_key),
                ("WAIT", self.replicas, self.timeout_ms),
            ]
            replies = self._send(node, commands)
            if is_noscript(replies[0]):  # a fresh primary (after a failover) lacks the script
                node.script_load(script.source)
                replies = self._send(node, commands)
        reply, _, acknowledged = replies
        if isinstance(reply, Exception):  # RedisOutOfMemory when refused for memory
            raise script_error(call.script.name, reply) from reply
        self._check(acknowledged, what, reply)
        return reply

    def confirm(self, client: RedisClient, probe_key: str, what: str, result: Any = None) -> int:
        """Return once the replicas have every write that returned before this call; raise
        :class:`NotReplicated` naming ``what`` when too few confirm in time.

        For writes made by other calls (a bulk pipeline, the consumer's acks). Sent without
        redis-py's retries: a retry could reconnect to a newly promoted primary and confirm
        there what the old one never passed on.
        """
        with redis_errors(f"waiting for replicas ({what})"):
            node = _node_client(client, probe_key)
            commands = [("INCR", probe_key), ("WAIT", self.replicas, self.timeout_ms)]
            probed, acknowledged = self._send(node, commands)
        if is_out_of_memory(probed):  # the writes are on the primary; nothing can confirm them
            raise NotReplicated(
                f"{what}: not confirmed by the replicas: Redis is out of memory and refused the "
                f"probe write ({probed}); it is on the primary but not known to be safe from a "
                "failover",
                result=result,
            )
        if isinstance(probed, Exception):  # a probe key of the wrong type, say
            raise ScriptFailed(f"waiting for replicas ({what}) failed: {probed}") from probed
        self._check(acknowledged, what, result)
        return int(acknowledged)

    def _send(self, node: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` (the last a WAIT) in one write on one pooled connection and read
        every reply (an error reply in its place), the WAIT's with a timeout past its own."""
        wait_seconds = self.timeout_ms / 1000 + WAIT_READ_MARGIN_SECONDS
        connection = get_connection(node.connection_pool)
        try:
            connection.send_packed_command(connection.pack_commands(commands))
            replies: list[Any] = []
            for i in range(len(commands)):
                last = i == len(commands) - 1
                try:
                    replies.append(read_reply(connection, wait_seconds if last else None))
                except redis.exceptions.ResponseError as e:
                    replies.append(e)
        except BaseException:
            connection.disconnect()  # an unread reply must never be left on it
            raise
        finally:
            node.connection_pool.release(connection)
        return replies

    def _check(self, acknowledged: Any, what: str, result: Any) -> None:
        if isinstance(acknowledged, Exception):
            raise acknowledged
        if int(acknowledged) < self.replicas:
            raise NotReplicated(
                f"{what}: {acknowledged} of {self.replicas} replica(s) confirmed it within "
                f"{self.timeout_ms} ms; it is on the primary but not safe from a failover yet",
                result=result,
            )


def _node_client(client: RedisClient, probe_key: str) -> Any:
    """The client of the server holding ``probe_key``: ``client`` itself, or on a cluster the
    primary of the key's slot (WAIT names no key, so the cluster client cannot route it)."""
    if isinstance(client, RedisCluster):
        return client.get_node_from_key(probe_key).redis_connection
    return client


def read_reply(connection: Any, at_least_seconds: float | None = None) -> Any:
    """The next reply on ``connection``; with ``at_least_seconds``, read with that timeout
    when its ``socket_timeout`` is shorter (a blocking command such as WAIT). A connection
    without a socket timeout keeps waiting as configured."""
    current = connection.socket_timeout
    if at_least_seconds is None or current is None or current >= at_least_seconds:
        return connection.read_response()
    if _read_takes_timeout(type(connection)):
        return connection.read_response(timeout=at_least_seconds)
    # An older redis-py reads with the socket's own timeout: set it for this read only.
    sock = connection._sock
    sock.settimeout(at_least_seconds)
    try:
        return connection.read_response()
    finally:
        if connection._sock is sock:
            sock.settimeout(current)


_takes_timeout_by_class: dict[type, bool] = {}


def _read_takes_timeout(connection_class: type[Any]) -> bool:
    takes = _takes_timeout_by_class.get(connection_class)
    if takes is None:
        parameters = inspect.signature(connection_class.read_response).parameters
        takes = _takes_timeout_by_class[connection_class] = "timeout" in parameters
    return takes
