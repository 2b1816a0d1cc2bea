"""Queue settings staff changed in the admin, published to Redis for every process.

The path is settings file -> ``QueueConfig`` rows (``mirror.kinds``) -> the queue's ``config``
hash in Redis (here, with a version and an update stamp) -> every process:
- :func:`effective_settings` (producers, via ``get_queue``) and :func:`load_published`
  (the worker, every ``SETTINGS_REFRESH_SECONDS``) merge the file settings with what is
  published. No process reads the database, or Redis, per message.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from django_delayqueue.conf.connection import get_client, get_clock
from django_delayqueue.conf.settings import dq_settings, file_queue_settings, queue_shards
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.calls import redis_errors
from django_delayqueue.core.settings import QueueSettings

logger = logging.getLogger(__name__)

# The queue settings staff may change in the admin (QueueConfig rows, published to Redis); the
# rest (payload limit, promote batch) stay in the settings file.
MIRRORED_FIELDS: tuple[str, ...] = (
    "max_attempts",
    "backoff_base",
    "backoff_max",
    "visibility_timeout",
    "claim_batch",
    "concurrency",
    "paused",
    "soft_time_limit",
    "time_limit",
    "abort_grace_seconds",
    "rate_limit",
    "max_in_flight",
    "lateness_warning_ms",
    "key_concurrency",
    "key_rate_limit",
)

VERSION_FIELD, UPDATED_FIELD = "version", "updated_ms"

_lock = threading.Lock()
_cache: dict[str, tuple[float, QueueSettings]] = {}  # name -> (expires, effective settings)


def config_key(name: str) -> str:
    return QueueKeys(dq_settings.PREFIX, name).config


def _shard_config_keys(name: str) -> list[str]:
    try:
        count = queue_shards(name)
    except ConfigurationError:  # reported by the checks; publish the queue's own key
        return []
    if count == 1:
        return []
    return [QueueKeys(dq_settings.PREFIX, name, shard).config for shard in range(count)]


# --- publishing -------------------------------------------------------------------------------


def publish(values_by_queue: dict[str, dict[str, Any]]) -> None:
    """Write each queue's settings to its ``config`` hash and bump its version (one round trip).

    Raises :class:`RedisUnavailable` when Redis is down.
    """
    if not values_by_queue:
        return
    client = get_client()
    now = get_clock().now_ms()
    pipe = client.pipeline(transaction=False)
    for name, values in values_by_queue.items():
        mapping = {field: json.dumps(value) for field, value in values.items()}
        mapping[UPDATED_FIELD] = str(now)
        # A sharded queue's shards get a copy: the stats script reads a shard's own (paused).
        for key in (config_key(name), *_shard_config_keys(name)):
            pipe.hset(key, mapping=mapping)
            pipe.hincrby(key, VERSION_FIELD, 1)
    with redis_errors("publishing queue settings"):
        pipe.execute()
    forget(values_by_queue)


# --- reading the effective settings -----------------------------------------------------------


def load_published(names: list[str], client: Any = None) -> dict[str, dict[str, Any] | None]:
    """The published overrides of each queue (None: nothing published), one round trip
    (through ``client``, default: the process-wide one).

    Raises :class:`RedisUnavailable` when Redis is down.
    """
    pipe = (client or get_client()).pipeline(transaction=False)
    for name in names:
        pipe.hgetall(config_key(name))
    with redis_errors("reading queue settings"):
        replies = pipe.execute()
    return {name: _decode(name, raw) for name, raw in zip(names, replies, strict=True)}


def merge(base: QueueSettings, overrides: dict[str, Any] | None) -> QueueSettings:
    """``base`` with the published overrides applied; invalid overrides are ignored (logged)."""
    if not overrides:
        return base
    try:
        return base.replace(**overrides)
    except (TypeError, ConfigurationError) as e:
        logger.warning("ignoring invalid published settings %s: %s", overrides, e)
        return base


def effective_settings(name: str) -> QueueSettings:
    """File settings merged with the published ones; Redis is read at most every refresh."""
    now = time.monotonic()
    entry = _cache.get(name)
    if entry is not None and entry[0] > now:
        return entry[1]
    base = file_queue_settings(name)
    try:
        value = merge(base, load_published([name])[name])
    except DelayQueueError as e:
        # Redis down: keep what we knew; the schedule call that follows reports the outage.
        logger.debug("queue %s: published settings unavailable: %s", name, e)
        value = entry[1] if entry is not None else base
    with _lock:
        _cache[name] = (now + float(dq_settings.SETTINGS_REFRESH_SECONDS), value)
    return value


def forget(names: Iterable[str] | None = None) -> None:
    """Drop cached effective settings (all, or of ``names``) so the next read goes to Redis."""
    with _lock:
        if names is None:
            _cache.clear()
        else:
            for name in names:
                _cache.pop(name, None)


def _decode(name: str, raw: dict[bytes, bytes] | None) -> dict[str, Any] | None:
    if not raw:
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        field = key.decode() if isinstance(key, bytes) else key
        if field not in MIRRORED_FIELDS:
            continue  # version, updated_ms, or fields of a newer release
        try:
            out[field] = json.loads(value)
        except ValueError:
            logger.warning("queue %s: unreadable published %s=%r", name, field, value)
    return out
