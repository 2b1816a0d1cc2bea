"""The one Redis client of the Django layer: from ``REDIS_URL`` or a django-redis cache alias."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import redis

from django_delayqueue.conf.settings import DEFAULT_REDIS_URL, DEFAULTS, dq_settings
from django_delayqueue.core.client import RedisClient, connect
from django_delayqueue.core.clock import Clock, RedisClock, SystemClock
from django_delayqueue.core.errors import ConfigurationError, RedisUnavailable
from django_delayqueue.core.replication import ReplicaAck

# A Redis that is down must make callers fail fast rather than hang a request or the loop;
# Lua scripts are bounded, so 30 s without a reply means something is wrong.
# Blocking commands set their own read timeouts (WAIT: core/replication.py; the wake channel:
# core/consumer/rounds/waiter.py), so this one cannot cut them short. RESP2, as the code is written
# and tested against and as redis-py 5 speaks by default: redis-py 8 would speak RESP3 (and
# ask each new connection for maintenance notifications) unless told.
DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 30,
    "socket_keepalive": True,
    "health_check_interval": 30,
    "protocol": 2,
}

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_client: RedisClient | None = None
_clock: Clock | None = None
# The client and clock of the monitoring endpoints' reads (see monitoring_reads), built once.
_monitoring: tuple[Any, Clock] | None = None
# Set inside monitoring_reads(): what get_client() and get_clock() answer there, or why the
# monitoring client could not be built (they raise it).
_reads: ContextVar[tuple[Any, Clock] | Exception | None] = ContextVar(
    "delayqueue_reads", default=None
)


SENTINEL_KEYS = frozenset(
    {"hosts", "service_name", "db", "password", "username", "sentinel_kwargs"}
)


def sentinel_config() -> dict[str, Any] | None:
    """``DELAYQUEUE['SENTINEL']`` checked and normalised (None when not set)."""
    config = dq_settings.SENTINEL
    if config is None:
        return None
    if not isinstance(config, dict):
        raise ConfigurationError(f"SENTINEL must be a dict, not {config!r}")
    unknown = sorted(set(config) - SENTINEL_KEYS)
    if unknown:
        raise ConfigurationError(
            f"SENTINEL: unknown key(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(sorted(SENTINEL_KEYS))}"
        )
    hosts = config.get("hosts")
    try:
        pairs = [(str(host), int(port)) for host, port in hosts]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        pairs = []
    if not pairs:
        raise ConfigurationError(f"SENTINEL['hosts'] must list [host, port] pairs, not {hosts!r}")
    if dq_settings.CACHE_ALIAS:
        raise ConfigurationError("SENTINEL and CACHE_ALIAS cannot be used together")
    return {**config, "hosts": pairs, "service_name": str(config.get("service_name", "mymaster"))}


def replica_ack() -> ReplicaAck | None:
    """What ``MIN_REPLICAS`` asks of each schedule (None: 0, nothing)."""
    count = dq_settings.MIN_REPLICAS
    if count in (0, None):
        return None
    timeout = dq_settings.MIN_REPLICAS_TIMEOUT_SECONDS
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < 3600  # also refuses inf and nan
    ):
        raise ConfigurationError(
            f"MIN_REPLICAS_TIMEOUT_SECONDS must be a positive number, not {timeout!r}"
        )
    return ReplicaAck(count, max(1, round(timeout * 1000)))


def make_client(**overrides: Any) -> Any:
    """A new client built from the settings (``overrides`` go to ``from_url``)."""
    cluster_conflicts()
    sentinel = sentinel_config()
    if sentinel is not None:
        return _sentinel_client(sentinel, overrides)
    alias = dq_settings.CACHE_ALIAS
    if alias:
        try:
            from django_redis import get_redis_connection
        except ImportError as e:  # pragma: no cover - django-redis is a dependency
            raise ConfigurationError("CACHE_ALIAS needs django-redis installed") from e
        try:
            return get_redis_connection(alias)
        except Exception as e:  # django-redis raises NotImplementedError / KeyError
            raise ConfigurationError(f"CACHE_ALIAS {alias!r}: {e}") from e
    url = redis_urls()
    options = {**DEFAULT_OPTIONS, **(dq_settings.REDIS_OPTIONS or {}), **overrides}
    # Envelopes are bytes on the wire; the core decodes what it reads itself.
    options["decode_responses"] = False
    return connect(url, cluster=bool(dq_settings.CLUSTER), **options)


def cluster_conflicts() -> None:
    """Raise ConfigurationError when ``CLUSTER`` is not a bool, or is set beside a way of
    connecting that cannot be a cluster (SENTINEL, CACHE_ALIAS)."""
    cluster = dq_settings.CLUSTER
    if not isinstance(cluster, bool):
        raise ConfigurationError(f"CLUSTER must be True or False, not {cluster!r}")
    if cluster and (dq_settings.SENTINEL is not None or dq_settings.CACHE_ALIAS):
        raise ConfigurationError("CLUSTER cannot be used with SENTINEL or CACHE_ALIAS")


def redis_urls() -> str | list[str]:
    """``REDIS_URL`` checked: a URL, or with ``CLUSTER`` a list of start nodes' URLs too."""
    url = dq_settings.REDIS_URL or DEFAULT_REDIS_URL
    cluster_conflicts()
    cluster = bool(dq_settings.CLUSTER)
    urls = url if cluster and isinstance(url, (list, tuple)) and url else [url]
    for one in urls:
        if not isinstance(one, str) or not one.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                f"REDIS_URL must start with redis://, rediss:// or unix://, not {one!r}"
                + ("" if cluster else " (a list of start nodes needs CLUSTER = True)")
            )
    return url if isinstance(url, str) else list(urls)


def get_client() -> Any:
    """The process-wide Redis client (thread-safe; one connection pool); inside
    :func:`monitoring_reads`, the monitoring endpoints' own."""
    reads = _reads.get()
    if reads is not None:
        return _monitoring_part(reads, 0)
    global _client
    client = _client
    if client is None:
        with _lock:
            if _client is None:
                _client = make_client()
            client = _client
    return client


def get_clock() -> Clock:
    """The shared clock: Redis server time by default, or the local clock (``CLOCK``); inside
    :func:`monitoring_reads`, the same read with the monitoring endpoints' client."""
    reads = _reads.get()
    if reads is not None:
        return _monitoring_part(reads, 1)
    global _clock
    clock = _clock
    if clock is None:
        kind = dq_settings.CLOCK
        if kind == "system":
            clock = SystemClock()
        elif kind == "redis":
            clock = RedisClock(get_client())
        else:
            raise ConfigurationError(f"CLOCK must be 'redis' or 'system', not {kind!r}")
        with _lock:
            if _clock is None:
                _clock = clock
            clock = _clock
    return clock


def reset() -> None:
    """Forget the cached client and clock (the next call builds them from the settings)."""
    global _client, _clock, _monitoring
    with _lock:
        # Not closed: a running worker may still hold the old client; its pool is collected.
        _client = None
        _clock = None
        _monitoring = None


def monitoring_timeout() -> float:
    """``MONITORING_TIMEOUT_SECONDS``: how long a read of the monitoring endpoints waits for
    Redis (a bad value, which the system check E016 reports, reads as the default)."""
    value = dq_settings.MONITORING_TIMEOUT_SECONDS
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if number and 0 < value < 3600:  # also refuses NaN
        return float(value)
    return float(DEFAULTS["MONITORING_TIMEOUT_SECONDS"])


@contextlib.contextmanager
def monitoring_reads() -> Iterator[None]:
    """Within: :func:`get_client` and :func:`get_clock` answer a client whose socket timeouts
    are ``MONITORING_TIMEOUT_SECONDS`` (and a clock read with it), so that ``metrics/`` and
    ``health/`` answer within their own deadline when Redis freezes: the app's client waits
    30 s for a reply, longer than a scraper or a probe waits for the page. Nothing built
    inside may be kept for later: :func:`in_monitoring_reads` tells the caches so (the
    Queue objects of get_queue are built uncached there).

    When that client cannot be built (a cluster client connects as it is built: a cluster
    that is down; a bad URL), :func:`get_client` and :func:`get_clock` raise why at once
    (:class:`RedisUnavailable`; :class:`ConfigurationError` for bad settings) rather than
    fall back to the app's client: its timeouts and retries are what these reads must not
    wait out, least of all when Redis is down."""
    reads: tuple[Any, Clock] | Exception
    try:
        reads = _monitoring_pair()
    except Exception as e:  # the build is tried again by the next request
        logger.debug("no monitoring client: %s", e)
        reads = e
    token = _reads.set(reads)
    try:
        yield
    finally:
        _reads.reset(token)


def in_monitoring_reads() -> bool:
    """Whether this code runs inside :func:`monitoring_reads` (what it builds with
    :func:`get_client` must not be cached for the rest of the process)."""
    return _reads.get() is not None


def _monitoring_part(reads: tuple[Any, Clock] | Exception, index: int) -> Any:
    """The monitoring client (``index`` 0) or clock (1); raises why it could not be built."""
    if isinstance(reads, ConfigurationError):
        raise ConfigurationError(str(reads)) from reads
    if isinstance(reads, Exception):
        raise RedisUnavailable(f"no monitoring client: {reads}") from reads
    return reads[index]


def _monitoring_pair() -> tuple[Any, Clock]:
    global _monitoring
    pair = _monitoring
    if pair is None:
        seconds = monitoring_timeout()
        client = _with_timeouts(seconds)
        clock: Clock = SystemClock() if dq_settings.CLOCK == "system" else RedisClock(client)
        with _lock:
            if _monitoring is None:
                _monitoring = (client, clock)
            pair = _monitoring
    return pair


def _with_timeouts(seconds: float) -> Any:
    """A client like :func:`make_client`'s whose connect and read timeouts are ``seconds``."""
    overrides = {"socket_timeout": seconds, "socket_connect_timeout": seconds}
    if not dq_settings.CACHE_ALIAS:
        return make_client(**overrides)
    # django-redis builds the cache's client: a pool of the same connections, shorter waits.
    base = make_client()
    pool: Any = getattr(base, "connection_pool", None)
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return base  # a pool we do not know how to copy (Sentinel's): its own timeouts
    kwargs = {**pool.connection_kwargs, **overrides}
    copy = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    return redis.Redis(connection_pool=copy)


def _sentinel_client(config: dict[str, Any], overrides: dict[str, Any]) -> Any:
    """The primary of ``service_name`` as the sentinels name it, followed across failovers:
    redis-py's SentinelConnectionPool asks the sentinels again whenever a connection to the
    primary fails or finds it read-only (demoted)."""
    from redis.sentinel import Sentinel

    options = {**DEFAULT_OPTIONS, **(dq_settings.REDIS_OPTIONS or {}), **overrides}
    options["decode_responses"] = False
    # The sentinels themselves: short timeouts, their own password if any.
    sentinel_kwargs = {
        "socket_connect_timeout": options["socket_connect_timeout"],
        "socket_timeout": options["socket_connect_timeout"],
        "protocol": options["protocol"],  # RESP2 as the primary's (redis-py 8: RESP3 else)
        **(config.get("sentinel_kwargs") or {}),
    }
    for key in ("password", "username"):
        if config.get(key) is not None:
            options[key] = config[key]
    sentinels = Sentinel(config["hosts"], sentinel_kwargs=sentinel_kwargs, **options)
    return sentinels.master_for(config["service_name"], db=int(config.get("db", 0)))
