"""The one Redis client of the Django layer: from ``REDIS_URL`` or a django-redis cache alias."""

from __future__ import annotations

import threading
from typing import Any

import redis

from django_delayqueue.conf.settings import DEFAULT_REDIS_URL, dq_settings
from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock, RedisClock, SystemClock
from django_delayqueue.core.errors import ConfigurationError

# A Redis that is down must make callers fail fast rather than hang a request or the loop;
# Lua scripts are bounded, so 30 s without a reply means something is wrong.
DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 30,
    "socket_keepalive": True,
    "health_check_interval": 30,
}

_lock = threading.Lock()
_client: RedisClient | None = None
_clock: Clock | None = None


def make_client(**overrides: Any) -> Any:
    """A new client built from the settings (``overrides`` go to ``from_url``)."""
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
    url = dq_settings.REDIS_URL or DEFAULT_REDIS_URL
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigurationError(
            f"REDIS_URL must start with redis://, rediss:// or unix://, not {url!r}"
        )
    options = {**DEFAULT_OPTIONS, **(dq_settings.REDIS_OPTIONS or {}), **overrides}
    # Envelopes are bytes on the wire; the core decodes what it reads itself.
    options["decode_responses"] = False
    return redis.Redis.from_url(url, **options)


def get_client() -> Any:
    """The process-wide Redis client (thread-safe; one connection pool)."""
    global _client
    client = _client
    if client is None:
        with _lock:
            if _client is None:
                _client = make_client()
            client = _client
    return client


def get_clock() -> Clock:
    """The shared clock: Redis server time by default, or the local clock (``CLOCK``)."""
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
    global _client, _clock
    with _lock:
        # Not closed: a running worker may still hold the old client; its pool is collected.
        _client = None
        _clock = None
