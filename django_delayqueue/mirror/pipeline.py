"""The one mechanism that keeps a kind of editable values in step (see the package docstring).

The settings file seeds a row per entry at each ``migrate`` and ``runqueue`` start: a field
whose file value changed since the last sync takes the new file value, one staff changed in
the admin keeps the staff value. A saved row is published to Redis once its transaction
commits (never a rolled-back edit). A publish Redis could not take is logged, not raised: the
row is saved, and runqueue publishes again what Redis lacks.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from typing import Any

from django.apps import AppConfig
from django.db import DatabaseError, transaction
from django.db.models.signals import post_delete, post_migrate, post_save

from django_delayqueue.core.errors import DelayQueueError

logger = logging.getLogger(__name__)


class Mirror(ABC):
    """One kind of values staff may edit, as rows of :attr:`model` (with the fields ``name``,
    ``from_settings`` and those of the values)."""

    model: type[Any]
    what: str  # how the logs name the kind: "queue settings", "recurring schedules"
    # Published as one set, in which a missing entry is a deleted one: a change publishes
    # every row, and a deleted row is a change too. Otherwise each row is published alone.
    whole_set: bool = False

    @abstractmethod
    def from_file(self) -> dict[str, dict[str, Any] | None]:
        """Each entry of the settings file: name -> its row's values (None: an invalid entry,
        logged here, whose row is left as it is)."""

    @abstractmethod
    def publish(self, rows: Sequence[Any]) -> Any:
        """Publish ``rows`` as they are: each alone, or (:attr:`whole_set`) as the whole set.

        Raises :class:`DelayQueueError` (Redis down, say)."""

    @abstractmethod
    def publish_from_db(self, using: str | None = None) -> Any:
        """Publish the rows as the database holds them. Raises :class:`DelayQueueError`."""

    def prune(self, existing: dict[str, Any], declared: Collection[str], using: str | None) -> None:
        """Delete the rows whose entry left the settings file (by default none: a queue's row
        outlives its entry, and keeps what staff set should the queue come back)."""
        return

    # --- the pipeline -----------------------------------------------------------------------

    def sync(self, *, using: str | None = None, publish_to_redis: bool = True) -> list[Any]:
        """Create or update a row per entry of the settings file (see :meth:`prune`), then
        publish them; returns the rows of the valid entries."""
        existing = {row.name: row for row in self.model.objects.using(using).all()}
        entries = self.from_file()
        rows = [
            self._sync_row(existing.get(name), name, values, using)
            for name, values in entries.items()
            if values is not None
        ]
        self.prune(existing, entries, using)
        if publish_to_redis:
            try:
                if self.whole_set:
                    self.publish_from_db(using)
                else:
                    self.publish(rows)
            except DelayQueueError as e:
                logger.warning("%s not published to Redis (will retry): %s", self.what, e)
        return rows

    def _sync_row(self, row: Any, name: str, file_values: dict[str, Any], using: str | None) -> Any:
        """Create ``row`` from the settings file, or update the fields whose file value changed
        since the last sync (those staff changed, and the file did not, keep their value)."""
        if row is None:
            row = self.model(name=name, **file_values, from_settings=file_values)
            row.save(using=using)
            return row
        changed = [f for f, v in file_values.items() if row.from_settings.get(f) != v]
        for field in changed:
            setattr(row, field, file_values[field])
        if changed or row.from_settings != file_values:
            row.from_settings = file_values
            row.save(using=using)
        return row

    def on_row_changed(self, sender: Any, instance: Any, **kwargs: Any) -> None:
        """post_save (and, for a whole set, post_delete): publish once the change commits."""
        if kwargs.get("raw"):  # loaddata
            return
        using = kwargs.get("using")
        # The row as saved (the object may change before the commit); a whole set is read
        # from the database at the commit.
        saved = None if self.whole_set else copy.copy(instance)

        def publish() -> None:
            try:
                if saved is None:
                    self.publish_from_db(using)
                else:
                    self.publish([saved])
            except DelayQueueError as e:
                # The row is saved; runqueue publishes again what Redis lacks.
                logger.warning("%s: %s saved but not published: %s", self.what, instance, e)

        transaction.on_commit(publish, using=using)

    def sync_after_migrate(self, sender: Any, using: str = "default", **kwargs: Any) -> None:
        """post_migrate: keep the rows in step with the settings file (never fails migrate)."""
        try:
            self.sync(using=using)
        except DatabaseError as e:  # e.g. `migrate django_delayqueue zero`: no table
            logger.debug("%s not synced after migrate: %s", self.what, e)

    def connect(self, app: AppConfig) -> None:
        """Connect the signals that run the pipeline (from ``AppConfig.ready``)."""
        label = self.model._meta.model_name
        post_migrate.connect(self.sync_after_migrate, sender=app, dispatch_uid=f"dq-sync-{label}")
        signals = (post_save, post_delete) if self.whole_set else (post_save,)
        for signal in signals:
            signal.connect(self.on_row_changed, sender=self.model, dispatch_uid=f"dq-pub-{label}")
