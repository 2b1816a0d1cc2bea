"""The kinds of values staff may edit, each kept in step by :class:`~.pipeline.Mirror`.

- :data:`queue_settings_mirror`: a ``QueueConfig`` row per configured queue; each saved row
  is published alone, to its queue's ``config`` hash (``mirror.queue_overrides``).
- :data:`recurrences_mirror`: a ``RecurringSchedule`` row per ``DELAYQUEUE["SCHEDULES"]``
  entry (and ``@periodic`` task), plus the rows staff add; every row is published at once, as
  the set every runqueue keeps (``mirror.recurrences``), under a lock.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import redis

from django_delayqueue.conf.settings import file_queue_settings, queue_names
from django_delayqueue.core.errors import ConfigurationError, RedisUnavailable
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.mirror import queue_overrides, recurrences
from django_delayqueue.mirror.pipeline import Mirror
from django_delayqueue.models import QueueConfig, RecurringSchedule
from django_delayqueue.tasks.periodic import discovered_all

logger = logging.getLogger(__name__)


class QueueSettingsMirror(Mirror):
    model = QueueConfig
    what = "queue settings"

    def from_file(self) -> dict[str, dict[str, Any] | None]:
        """Queues with invalid settings are left out (the system checks report them)."""
        out: dict[str, dict[str, Any] | None] = {}
        for name in queue_names():
            try:
                out[name] = _mirrored(name)
            except ConfigurationError as e:
                logger.error("queue %s not synced: %s", name, e)
                out[name] = None
        return out

    def publish(self, rows: Sequence[QueueConfig]) -> None:
        queue_overrides.publish({row.name: row.mirrored_values() for row in rows})

    def publish_from_db(self, using: str | None = None, names: Iterable[str] | None = None) -> int:
        """Publish the rows of ``names`` (default: every configured queue); returns how many
        there were (a queue may have none yet)."""
        wanted = list(queue_names() if names is None else names)
        rows = list(QueueConfig.objects.using(using).filter(name__in=wanted))
        self.publish(rows)
        return len(rows)


# A settings entry as a RecurringSchedule row's fields.
ROW_FIELDS = (
    "queue", "cron", "every", "timezone", "payload", "task", "backend", "args", "kwargs",
    "catch_up", "catch_up_limit", "paused", "key",
)  # fmt: skip


class RecurrencesMirror(Mirror):
    model = RecurringSchedule
    what = "recurring schedules"
    whole_set = True

    def from_file(self) -> dict[str, dict[str, Any] | None]:
        out: dict[str, dict[str, Any] | None] = {}
        for name, options in recurrences.declared().items():
            try:
                out[name] = row_values(name, options)
            except ConfigurationError as e:
                logger.error("recurring schedule not synced: %s", e)
                out[name] = None
        return out

    def prune(
        self, existing: dict[str, RecurringSchedule], declared: Collection[str], using: str | None
    ) -> None:
        """A row from the settings file whose entry left it is deleted (rows added in the
        admin stay; so does one of an invalid entry)."""
        if not discovered_all():
            # A tasks module failed to import: its @periodic tasks are not gone, only unseen.
            logger.warning("recurring schedule rows not pruned: a tasks module failed to import")
            return
        for name, row in existing.items():
            if row.from_settings and name not in declared:
                row.delete(using=using)  # it came from the file, which no longer has it

    def publish(self, rows: Sequence[RecurringSchedule]) -> int:
        """Publish ``rows`` as the whole set (a schedule missing from it is a deleted one);
        returns the new version. A row stored past validation is left out (logged)."""
        definitions = {}
        for row in rows:
            try:
                recurrence = Recurrence.from_mapping(row.name, row.definition())
            except ConfigurationError as e:
                logger.error("recurring schedule not published: %s", e)
                continue
            definitions[row.name] = recurrence.to_mapping()
        return recurrences.publish(definitions)

    def publish_from_db(self, using: str | None = None) -> int:
        """Publish every row; returns the new version.

        Under a lock, so that the rows read are never older than what another process published.
        """
        lock = recurrences.publish_lock()
        try:
            acquired = lock.acquire()
        except redis.exceptions.RedisError as e:
            raise RedisUnavailable(f"publishing recurring schedules: {e}") from e
        if not acquired:
            logger.warning("publishing recurring schedules without the lock (held too long)")
        try:
            return self.publish(list(RecurringSchedule.objects.using(using).all()))
        finally:
            if acquired:
                with contextlib.suppress(redis.exceptions.RedisError):  # it expires
                    lock.release()


def row_values(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A ``DELAYQUEUE["SCHEDULES"]`` entry as the row's field values (validated:
    ConfigurationError)."""
    recurrence = Recurrence.from_mapping(name, options)
    values = recurrence.to_mapping()
    values["cron"] = values["cron"] or ""
    values["task"] = values["task"] or ""
    values["args"] = list(values["args"])
    values["key"] = values.get("key")  # left out of the mapping when None
    return {f: values[f] for f in ROW_FIELDS}


queue_settings_mirror = QueueSettingsMirror()
recurrences_mirror = RecurrencesMirror()
MIRRORS: tuple[Mirror, ...] = (queue_settings_mirror, recurrences_mirror)


def set_paused(name: str, paused: bool) -> QueueConfig:
    """Pause or resume queue ``name`` from code (the row is saved, then published on commit)."""
    row = QueueConfig.objects.filter(name=name).first()
    if row is None:
        values = _mirrored(name)
        row = QueueConfig(name=name, **values, from_settings=values)
    row.paused = paused
    row.save()
    return row


def _mirrored(name: str) -> dict[str, Any]:
    """Queue ``name``'s settings file values of the fields staff may edit."""
    settings = file_queue_settings(name)
    return {f: getattr(settings, f) for f in queue_overrides.MIRRORED_FIELDS}
