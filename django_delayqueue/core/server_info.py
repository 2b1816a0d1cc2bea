"""What a Redis server says about itself that decides whether messages are safe on it.

Read with ``INFO``, which managed services allow where they disable ``CONFIG``:

- memory: ``used_memory``, ``maxmemory`` (0: no limit) and ``maxmemory_policy``. Any policy but
  ``noeviction`` lets Redis delete keys when memory is full: whole keys of a queue (its
  pending zset, its payload hash) and every message in them, without an error to anyone;
- persistence: ``aof_enabled``, and whether RDB snapshots are taken. ``INFO`` does not show the
  ``save`` schedule, so it is read with ``CONFIG GET save`` where allowed; where not, only an
  AOF tells (snapshots are then "unknown", not "off": a provider may take them its own way);
- server: the version, and the config file, whose name tells the embedded server of the demo
  and the tests (``django_delayqueue.embedded``), which keeps nothing on purpose.

Every primary of a cluster is read; a Sentinel client's commands go to the primary. Nothing
here raises for Redis errors: a server that cannot be read has ``error`` set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from django_delayqueue.core.client import RedisClient

NOEVICTION = "noeviction"
# The config file django_delayqueue.embedded starts its servers with: it marks them disposable.
EMBEDDED_CONFIG_NAME = "delayqueue-embedded.conf"


@dataclass(frozen=True)
class ServerInfo:
    """One Redis server as it describes itself. ``None``: not known (or not read)."""

    address: str
    version: str | None = None
    used_memory: int | None = None
    maxmemory: int | None = None  # 0: no limit
    policy: str | None = None  # maxmemory-policy
    aof: bool | None = None  # appendonly
    snapshots: bool | None = None  # RDB snapshots on a schedule (None: CONFIG not allowed)
    embedded: bool = False  # started by django_delayqueue.embedded (the demo, the tests)
    error: str = ""  # why it could not be read
    unreachable: bool = False  # the error was an outage (down, timed out, loading its data)

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def evicts(self) -> bool:
        """Whether Redis may delete keys (messages) when its memory is full."""
        return self.policy is not None and self.policy != NOEVICTION

    @property
    def memory_percent(self) -> float | None:
        """``used_memory`` as a percentage of ``maxmemory`` (None without a limit)."""
        if not self.maxmemory or self.used_memory is None:
            return None
        return 100.0 * self.used_memory / self.maxmemory

    @property
    def out_of_memory(self) -> bool:
        """Whether Redis refuses writes that need memory now (noeviction and over the limit)."""
        return bool(self.maxmemory) and (self.used_memory or 0) > (self.maxmemory or 0)

    @property
    def persistent(self) -> bool | None:
        """Whether a restart keeps the data: an AOF or RDB snapshots (None: cannot tell)."""
        if self.aof or self.snapshots:
            return True
        if self.aof is None or self.snapshots is None:
            return None
        return False

    @property
    def persistence(self) -> str:
        """A short description: "AOF", "RDB", "AOF + RDB", "none" or "unknown"."""
        kinds = [name for name, on in (("AOF", self.aof), ("RDB", self.snapshots)) if on]
        if kinds:
            return " + ".join(kinds)
        return "none" if self.persistent is False else "unknown"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``queuestats --json``, the health check)."""
        return {
            **asdict(self),
            "evicts": self.evicts,
            "memory_percent": self.memory_percent,
            "persistence": self.persistence,
        }


def read_servers(client: RedisClient) -> list[ServerInfo]:
    """Every server ``client`` writes to: the one server, or each primary of a cluster."""
    if isinstance(client, RedisCluster):
        try:
            primaries = client.get_primaries()
        except redis.RedisError as e:
            return [ServerInfo("cluster", error=str(e), unreachable=True)]
        return [read_server(client.get_redis_connection(n), n.name) for n in primaries]
    return [read_server(client, address_of(client))]


def read_server(client: redis.Redis, address: str) -> ServerInfo:
    """One server's :class:`ServerInfo` (``error`` set when it cannot be read)."""
    try:
        pipe = client.pipeline(transaction=False)
        for section in ("memory", "persistence", "server"):  # one section a call on 6.2
            pipe.info(section)
        memory, persistence, server = pipe.execute()
    except redis.RedisError as e:  # down, a timeout, INFO not allowed
        outage = isinstance(e, (redis.ConnectionError, redis.TimeoutError))
        return ServerInfo(address, error=f"{type(e).__name__}: {e}", unreachable=outage)
    return ServerInfo(
        address,
        version=_text(server.get("redis_version")),
        used_memory=_number(memory.get("used_memory")),
        maxmemory=_number(memory.get("maxmemory")),
        policy=_text(memory.get("maxmemory_policy")),
        aof=None if "aof_enabled" not in persistence else bool(persistence["aof_enabled"]),
        snapshots=_snapshots(client),
        embedded=_embedded(server),
    )


def address_of(client: Any) -> str:
    """How a client's server is named in messages: host:port, a socket path, or the primary
    a Sentinel client follows."""
    pool = getattr(client, "connection_pool", None)
    master = getattr(pool, "get_master_address", None)
    if callable(master):
        service = getattr(pool, "service_name", "")
        try:
            host, port = master()
        except redis.RedisError:
            return f"sentinel service {service}"
        return f"{host}:{port} (sentinel service {service})"
    kwargs: Mapping[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _snapshots(client: redis.Redis) -> bool | None:
    """Whether RDB snapshots are scheduled (``save`` is not empty); None when CONFIG is not
    allowed (a managed service, an ACL): INFO cannot tell."""
    try:
        value = client.config_get("save").get("save")
    except redis.RedisError:
        return None
    text = _text(value)
    return None if text is None else bool(text.strip())


def _embedded(server: Mapping[str, Any]) -> bool:
    path = _text(server.get("config_file")) or ""
    return os.path.basename(path) == EMBEDDED_CONFIG_NAME


def _number(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
