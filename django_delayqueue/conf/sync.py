"""The queue settings rows (``QueueConfig``) kept in step with the settings file and Redis.

The settings file seeds a row per queue; staff edit rows in the admin; a saved row is published
to Redis (``conf.overrides``) once its transaction commits, and every process reads it there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError, transaction

from django_delayqueue.conf.overrides import publish
from django_delayqueue.conf.settings import MIRRORED_FIELDS, file_queue_settings, queue_names
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.models import QueueConfig

logger = logging.getLogger(__name__)


def publish_rows(rows: Iterable[QueueConfig]) -> None:
    publish({row.name: row.mirrored_values() for row in rows})


def publish_from_db(names: Iterable[str] | None = None, using: str | None = None) -> int:
    """Publish the rows of ``names`` (default: every configured queue); returns rows published."""
    wanted = list(queue_names() if names is None else names)
    rows = list(QueueConfig.objects.using(using).filter(name__in=wanted))
    publish_rows(rows)
    return len(rows)


def set_paused(name: str, paused: bool) -> QueueConfig:
    """Pause or resume queue ``name`` from code (the row is saved, then published on commit)."""
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


def sync_queue_configs(*, using: str | None = None, publish_to_redis: bool = True) -> list[Any]:
    """Create or update a row per configured queue, then publish them all.

    A field whose value in the settings file changed since the last sync takes the new file
    value; a field staff changed in the admin keeps the staff value. Queues with invalid
    settings are skipped (the system checks report them). Publishing failures are logged.
    """
    rows = []
    existing = {r.name: r for r in QueueConfig.objects.using(using).filter(name__in=queue_names())}
    for name in queue_names():
        try:
            file_values = _mirrored(file_queue_settings(name), MIRRORED_FIELDS)
        except ConfigurationError as e:
            logger.error("queue %s not synced: %s", name, e)
            continue
        rows.append(sync_row(QueueConfig, existing.get(name), name, file_values, using))
    if publish_to_redis:
        try:
            publish_rows(rows)
        except DelayQueueError as e:
            logger.warning("queue settings not published to Redis (will retry): %s", e)
    return rows


def sync_row(
    model: Any, row: Any, name: str, file_values: dict[str, Any], using: str | None
) -> Any:
    """Create ``row`` from the settings file, or update it: a field whose file value changed
    since the last sync takes the new file value, one staff changed in the admin keeps it.
    Shared by the queue settings rows and the recurring schedule rows."""
    if row is None:
        row = model(name=name, **file_values, from_settings=file_values)
        row.save(using=using)
        return row
    changed = [f for f, v in file_values.items() if row.from_settings.get(f) != v]
    for field in changed:
        setattr(row, field, file_values[field])
    if changed or row.from_settings != file_values:
        row.from_settings = file_values
        row.save(using=using)
    return row


def sync_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate: keep the rows in step with the settings file (never fails migrate)."""
    try:
        sync_queue_configs(using=using)
    except DatabaseError as e:  # e.g. `migrate django_delayqueue zero`: no table
        logger.debug("queue settings not synced after migrate: %s", e)


def _new_row(name: str) -> QueueConfig:
    values = _mirrored(file_queue_settings(name), MIRRORED_FIELDS)
    return QueueConfig(name=name, **values, from_settings=values)


def _mirrored(settings: QueueSettings, names: Iterable[str]) -> dict[str, Any]:
    return {f: getattr(settings, f) for f in names}
