"""The settings mirror: settings file -> ``QueueConfig`` rows -> Redis -> every process.

- :func:`sync_queue_configs` creates/updates one row per configured queue (after ``migrate``
  and when ``runqueue`` starts) and publishes every row.
- Saving a row (the admin) publishes it, on commit, to the queue's ``config`` hash in Redis
  with a version and an update stamp.
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
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.db import DatabaseError, transaction

from .conf import SETTING_NAME, dq_settings, file_queue_settings, queue_names
from .connection import get_client, get_clock
from .core.errors import ConfigurationError, DelayQueueError
from .core.keys import QueueKeys
from .core.scripts import redis_errors
from .core.settings import QueueSettings

if TYPE_CHECKING:
    from .models import QueueConfig

logger = logging.getLogger(__name__)

VERSION_FIELD, UPDATED_FIELD = "version", "updated_ms"

_lock = threading.Lock()
_cache: dict[str, tuple[float, QueueSettings]] = {}  # name -> (expires, effective settings)


def config_key(name: str) -> str:
    return QueueKeys(dq_settings.PREFIX, name).config


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
        key = config_key(name)
        mapping = {field: json.dumps(value) for field, value in values.items()}
        mapping[UPDATED_FIELD] = str(now)
        pipe.hset(key, mapping=mapping)
        pipe.hincrby(key, VERSION_FIELD, 1)
    with redis_errors("publishing queue settings"):
        pipe.execute()
    forget(values_by_queue)


def publish_rows(rows: Iterable[QueueConfig]) -> None:
    publish({row.name: row.mirrored_values() for row in rows})


def publish_from_db(names: Iterable[str] | None = None, using: str | None = None) -> int:
    """Publish the rows of ``names`` (default: every configured queue); returns rows published."""
    from .models import QueueConfig

    wanted = list(queue_names() if names is None else names)
    rows = list(QueueConfig.objects.using(using).filter(name__in=wanted))
    publish_rows(rows)
    return len(rows)


def set_paused(name: str, paused: bool) -> QueueConfig:
    """Pause or resume queue ``name`` from code (the row is saved, then published on commit)."""
    from .models import QueueConfig

    row = QueueConfig.objects.filter(name=name).first() or _new_row(name)
    row.paused = paused
    row.save()
    return row


def on_config_saved(sender: Any, instance: QueueConfig, **kwargs: Any) -> None:
    """post_save of QueueConfig: publish once the row is committed (never a rolled-back edit)."""
    if kwargs.get("raw"):  # loaddata
        return
    values = {instance.name: instance.mirrored_values()}

    def send() -> None:
        try:
            publish(values)
        except DelayQueueError as e:
            # The row is saved; runqueue republishes rows whose config is missing in Redis.
            logger.warning("queue %s: settings saved but not published: %s", instance.name, e)

    transaction.on_commit(send, using=kwargs.get("using"))


# --- syncing rows from the settings file ------------------------------------------------------


def sync_queue_configs(*, using: str | None = None, publish_to_redis: bool = True) -> list[Any]:
    """Create or update a row per configured queue, then publish them all.

    A field whose value in the settings file changed since the last sync takes the new file
    value; a field staff changed in the admin keeps the staff value. Queues with invalid
    settings are skipped (the system checks report them). Publishing failures are logged.
    """
    from .models import MIRRORED_FIELDS, QueueConfig

    rows = []
    existing = {r.name: r for r in QueueConfig.objects.using(using).filter(name__in=queue_names())}
    for name in queue_names():
        try:
            file_values = _mirrored(file_queue_settings(name), MIRRORED_FIELDS)
        except ConfigurationError as e:
            logger.error("queue %s not synced: %s", name, e)
            continue
        row = existing.get(name)
        if row is None:
            row = QueueConfig(name=name, **file_values, from_settings=file_values)
            row.save(using=using)
        else:
            changed = [f for f, v in file_values.items() if row.from_settings.get(f) != v]
            for field in changed:
                setattr(row, field, file_values[field])
            if changed or row.from_settings != file_values:
                row.from_settings = file_values
                row.save(using=using)
        rows.append(row)
    if publish_to_redis:
        try:
            publish_rows(rows)
        except DelayQueueError as e:
            logger.warning("queue settings not published to Redis (will retry): %s", e)
    return rows


def sync_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate: keep the rows in step with the settings file (never fails migrate)."""
    try:
        sync_queue_configs(using=using)
    except DatabaseError as e:  # e.g. `migrate django_delayqueue zero`: no table
        logger.debug("queue settings not synced after migrate: %s", e)


def _new_row(name: str) -> QueueConfig:
    from .models import MIRRORED_FIELDS, QueueConfig

    values = _mirrored(file_queue_settings(name), MIRRORED_FIELDS)
    return QueueConfig(name=name, **values, from_settings=values)


def _mirrored(settings: QueueSettings, names: Iterable[str]) -> dict[str, Any]:
    return {f: getattr(settings, f) for f in names}


# --- reading the effective settings -----------------------------------------------------------


def load_published(names: list[str]) -> dict[str, dict[str, Any] | None]:
    """The published overrides of each queue (None: nothing published), one round trip.

    Raises :class:`RedisUnavailable` when Redis is down.
    """
    pipe = get_client().pipeline(transaction=False)
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
    from .models import MIRRORED_FIELDS

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


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        forget()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_delayqueue.mirror")
