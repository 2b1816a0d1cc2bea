"""The ``RecurringSchedule`` rows kept in step with the settings file, and published.

As with queue settings: the settings file seeds a row per schedule, staff edit or add rows in
the admin, and a saved or deleted row is published once its transaction commits.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import redis
from django.db import transaction

from django_delayqueue.conf.sync import sync_row
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, RedisUnavailable
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.models import RecurringSchedule
from django_delayqueue.recurring.definitions import declared, publish, publish_lock
from django_delayqueue.tasks.periodic import discovered_all

logger = logging.getLogger(__name__)

ROW_FIELDS = (
    "queue", "cron", "every", "timezone", "payload", "task", "backend", "args", "kwargs",
    "catch_up", "catch_up_limit", "paused",
)  # fmt: skip


def row_values(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A settings entry as the row's field values (validated: ConfigurationError)."""
    recurrence = Recurrence.from_mapping(name, options)
    values = recurrence.to_mapping()
    values["cron"] = values["cron"] or ""
    values["task"] = values["task"] or ""
    values["args"] = list(values["args"])
    return {f: values[f] for f in ROW_FIELDS}


def publish_rows(using: str | None = None) -> int:
    """Publish every row (the whole set: a row missing from it is a deleted schedule).

    Under a lock, so that the rows read are never older than what another process published.
    """
    lock = publish_lock()
    try:
        acquired = lock.acquire()
    except redis.exceptions.RedisError as e:
        raise RedisUnavailable(f"publishing recurring schedules: {e}") from e
    if not acquired:
        logger.warning("publishing recurring schedules without the lock (held too long)")
    try:
        definitions = {}
        for row in RecurringSchedule.objects.using(using).all():
            try:
                recurrence = Recurrence.from_mapping(row.name, row.definition())
            except ConfigurationError as e:
                logger.error("recurring schedule not published: %s", e)
                continue
            definitions[row.name] = recurrence.to_mapping()
        return publish(definitions)
    finally:
        if acquired:
            with contextlib.suppress(redis.exceptions.RedisError):  # it expires
                lock.release()


def sync_schedules(*, using: str | None = None, publish_to_redis: bool = True) -> list[Any]:
    """Create or update a row per ``DELAYQUEUE["SCHEDULES"]`` entry; delete the rows of
    entries that left the file (rows added in the admin stay); then publish."""
    rows = []
    existing = {r.name: r for r in RecurringSchedule.objects.using(using).all()}
    declared_now = declared()
    for name, options in declared_now.items():
        try:
            file_values = row_values(name, options)
        except ConfigurationError as e:
            logger.error("recurring schedule not synced: %s", e)
            continue
        rows.append(sync_row(RecurringSchedule, existing.get(name), name, file_values, using))
    if discovered_all():
        for name, row in existing.items():
            if row.from_settings and name not in declared_now:
                row.delete(using=using)  # it came from the file, which no longer has it
    else:  # a tasks module failed to import: its @periodic tasks are not gone, only unseen
        logger.warning("recurring schedule rows not pruned: a tasks module failed to import")
    if publish_to_redis:
        try:
            publish_rows(using)
        except DelayQueueError as e:
            logger.warning("recurring schedules not published to Redis (will retry): %s", e)
    return rows


def on_schedule_changed(sender: Any, instance: RecurringSchedule, **kwargs: Any) -> None:
    """post_save / post_delete: publish the whole set once the change is committed."""
    if kwargs.get("raw"):  # loaddata
        return
    using = kwargs.get("using")

    def send() -> None:
        try:
            publish_rows(using)
        except DelayQueueError as e:
            logger.warning("recurring schedules saved but not published: %s", e)

    transaction.on_commit(send, using=using)


def sync_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate: keep the rows in step with the settings file (never fails migrate)."""
    from django.db import DatabaseError

    try:
        sync_schedules(using=using)
    except DatabaseError as e:  # e.g. `migrate django_delayqueue zero`: no table
        logger.debug("recurring schedules not synced after migrate: %s", e)
