"""Rows that mirror the queue settings, so staff can tune a queue in the admin.

Consumers and producers never read these rows per message: a saved row is published to the
queue's ``config`` hash in Redis (see ``django_delayqueue.mirror``), which processes re-read
every few seconds.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from django_delayqueue.conf.settings import queue_shards, settings_problems
from django_delayqueue.core.envelope import MAX_ID_LENGTH, MAX_KEY_LENGTH
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.flow_limits import shards_problem
from django_delayqueue.core.settings import LIMIT_FIELDS, LIMIT_MARGIN_SECONDS, QueueSettings
from django_delayqueue.core.sharding import keyed_schedule_problem
from django_delayqueue.mirror.queue_overrides import MIRRORED_FIELDS

_D = QueueSettings()


class QueueConfig(models.Model):
    """The settings of one configured queue, as staff last left them."""

    name = models.CharField(max_length=100, unique=True)
    max_attempts = models.PositiveIntegerField(default=_D.max_attempts)
    backoff_base = models.FloatField(
        default=_D.backoff_base, help_text="Seconds before the first retry."
    )
    backoff_max = models.FloatField(
        default=_D.backoff_max, help_text="Cap on the exponential backoff, in seconds."
    )
    visibility_timeout = models.FloatField(
        default=_D.visibility_timeout,
        help_text="Seconds a claimed message stays invisible before it is retried.",
    )
    claim_batch = models.PositiveIntegerField(default=_D.claim_batch)
    concurrency = models.PositiveIntegerField(
        default=_D.concurrency,
        help_text="Handler threads per queue in each runqueue (unless --concurrency).",
    )
    paused = models.BooleanField(
        default=_D.paused, help_text="Paused queues keep scheduling but deliver nothing."
    )
    soft_time_limit = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds a handler may run before dq.SoftTimeLimitExceeded is raised in it "
        "(empty: no limit).",
    )
    time_limit = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds a handler may run before it is stopped and its message retried "
        "(empty: no limit). Keep visibility_timeout at least 2 s above it.",
    )
    abort_grace_seconds = models.FloatField(
        default=_D.abort_grace_seconds,
        help_text="After a Stop (dq.abort), seconds a running handler gets to stop by itself.",
    )
    # Flow control across every consumer (docs/flow-control.md), followed live by runqueue.
    rate_limit = models.CharField(
        max_length=40,
        null=True,
        blank=True,
        help_text='At most this many messages start, across every consumer: "20/s", "1200/m", '
        '"100/h", with an optional burst ("20/s burst 5"). Empty: no limit.',
    )
    max_in_flight = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many messages of the queue run at once, across every consumer "
        "(whatever their concurrency). Empty: no cap.",
    )
    # Lateness you can watch (docs/observability.md): the admin flags the queue past it.
    lateness_warning_ms = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Flag the queue (admin, queuestats, the health probe when asked) when the "
        "p99 of its handlers' start lateness over the last 5 minutes passes this many "
        "milliseconds. Empty: no warning.",
    )
    key_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many messages of one flow key (schedule(..., key=...)) run at "
        "once, across every consumer. Empty: no cap.",
    )
    key_rate_limit = models.CharField(
        max_length=40,
        null=True,
        blank=True,
        help_text='At most this many messages of one flow key start: "1/s", "60/m", with an '
        'optional burst ("1/s burst 3"). Empty: no limit.',
    )
    updated_at = models.DateTimeField(auto_now=True)
    # What the settings file said at the last sync: a field whose file value changed since
    # is taken from the file, one that staff changed is kept (see mirror.pipeline.Mirror.sync).
    from_settings = models.JSONField(default=dict, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name = "queue settings"
        verbose_name_plural = "queue settings"

    def __str__(self) -> str:
        return f"{self.name}{' (paused)' if self.paused else ''}"

    def mirrored_values(self) -> dict[str, Any]:
        """The row's settings, as a dict of :data:`MIRRORED_FIELDS`."""
        return {f: getattr(self, f) for f in MIRRORED_FIELDS}

    def clean(self) -> None:
        values = self.mirrored_values()
        problems = settings_problems(values)
        if problems:
            raise ValidationError(problems)
        # What E015 refuses for the shards the settings file spreads the queue over: shares
        # of the limits that would add up to more than them (docs/flow-control.md).
        split = shards_problem(self.rate_limit, self.max_in_flight, self._shards())
        if split:
            field = "max_in_flight" if split.startswith("max_in_flight") else "rate_limit"
            raise ValidationError({field: split})
        chosen = {k: v for k, v in values.items() if v is not None or k in LIMIT_FIELDS}
        if QueueSettings(**chosen).uncovered_limit():
            raise ValidationError(
                {
                    "time_limit": f"visibility_timeout must be at least time_limit + "
                    f"{LIMIT_MARGIN_SECONDS:g}s: a consumer cut off from Redis could otherwise "
                    "see its message delivered again while the handler still runs."
                }
            )

    def _shards(self) -> int:
        """How many shards the settings file spreads this queue over (1 if it cannot say)."""
        try:
            return queue_shards(self.name)
        except ConfigurationError:
            return 1


class QueueMessage(models.Model):
    """No table: gives the admin's message pages their view/change/delete permissions."""

    class Meta:
        managed = False
        default_permissions = ("view", "change", "delete")
        verbose_name = "queued message"


class OutboxMessage(models.Model):
    """A message scheduled inside a database transaction, kept until Redis has it.

    Written in the transaction that schedules it (so a rollback removes it too), sent and
    deleted right after the commit; if Redis could not take it then, ``runqueue``'s relay sends
    it later, with its original due time (``django_delayqueue.outbox``).
    """

    SCHEDULE, REPLACE, TASK = "schedule", "replace", "task"
    MODES = [(SCHEDULE, "schedule"), (REPLACE, "schedule, replacing"), (TASK, "task")]

    # The send token too (Queue.send_once): a row sent twice is stored once.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.CharField(max_length=100)
    message_id = models.CharField("message id", max_length=MAX_ID_LENGTH)
    due_ms = models.BigIntegerField(help_text="Due time, ms since the epoch (UTC).")
    envelope = models.TextField(help_text="The message as Redis stores it.")
    mode = models.CharField(max_length=10, choices=MODES, default=SCHEDULE)
    # A task's result record ('enqueued' field, JSON) and priority (mode "task").
    record = models.TextField(blank=True, default="")
    priority = models.SmallIntegerField(default=0)
    # The uniqueness window asked for (schedule(..., unique_for=)), ms; None (or 0) for none.
    # Counted from the send, like every window: a row relayed later opens (or meets) it then.
    # Nullable, not NOT NULL with a default: Django keeps no default in the database, so the
    # rows a process not yet upgraded writes during a rolling deploy (without this column)
    # would fail its user's transaction.
    unique_ms = models.BigIntegerField("uniqueness window (ms)", null=True, default=None)
    # No indexes: every row costs its insert and delete on a view's request, and the table is
    # empty but for a Redis outage's backlog, which a relay reads oldest first in batches.
    created_at = models.DateTimeField(default=timezone.now)
    # Whoever sends the row holds it until then: the committing process right after the
    # commit, else a relay. A relay takes only rows whose lease is over (or never given).
    leased_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Sends that failed so far.")
    relayed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a relay last tried to send it."
    )
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["created_at"]
        verbose_name = "outbox message"
        default_permissions = ("view", "delete")

    def __str__(self) -> str:
        return f"{self.queue}/{self.message_id}"


class RecurringSchedule(models.Model):
    """A recurring schedule (cron or interval) that ``runqueue`` keeps firing, once per tick.

    Rows come from ``DELAYQUEUE["SCHEDULES"]`` (kept in step at each migrate and runqueue
    start) or are added in the admin. Saved rows are published to Redis, where every runqueue
    reads them within ``SETTINGS_REFRESH_SECONDS`` (``django_delayqueue.mirror``).
    """

    CATCH_UP = [
        ("latest", "latest: run the most recent missed tick once"),
        ("all", "all: run every missed tick (up to the limit)"),
        ("none", "none: skip missed ticks"),
    ]

    name = models.CharField(max_length=100, unique=True)
    queue = models.CharField(max_length=100)
    cron = models.CharField(
        max_length=200, blank=True, default="", help_text="e.g. '0 3 * * *' (or give 'every')."
    )
    every = models.FloatField(null=True, blank=True, help_text="Seconds between ticks (>= 1).")
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="For cron, e.g. Europe/Berlin."
    )
    payload = models.JSONField(null=True, blank=True)
    task = models.CharField(
        max_length=300, blank=True, default="", help_text="Dotted path of a @task to run instead."
    )
    backend = models.CharField(max_length=100, default="default", help_text="TASKS alias.")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    catch_up = models.CharField(max_length=10, choices=CATCH_UP, default="latest")
    catch_up_limit = models.PositiveIntegerField(default=100)
    paused = models.BooleanField(default=False)
    # Nullable, as OutboxMessage.unique_ms: the rows a process not yet upgraded writes during a
    # rolling deploy (without this column) must not fail its transaction.
    key = models.CharField(
        "flow key",
        max_length=MAX_KEY_LENGTH,
        null=True,
        blank=True,
        default=None,
        help_text="Every tick's flow key, which the queue's key limits count by. Empty: none.",
    )
    updated_at = models.DateTimeField(auto_now=True)
    # What DELAYQUEUE["SCHEDULES"] said at the last sync (empty: added in the admin). As for
    # QueueConfig, a field whose file value changed is taken from the file, one staff changed
    # is kept; a row whose schedule left the settings file is deleted.
    from_settings = models.JSONField(default=dict, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name = "recurring schedule"

    def __str__(self) -> str:
        return f"{self.name}{' (paused)' if self.paused else ''}"

    def definition(self) -> dict[str, Any]:
        """The row as a ``DELAYQUEUE["SCHEDULES"]`` entry."""
        values: dict[str, Any] = {
            "queue": self.queue,
            "timezone": self.timezone,
            "catch_up": self.catch_up,
            "catch_up_limit": self.catch_up_limit,
            "paused": self.paused,
        }
        if self.cron:
            values["cron"] = self.cron
        if self.every is not None:
            values["every"] = self.every
        if self.task:
            values.update(
                task=self.task, backend=self.backend, args=self.args or [], kwargs=self.kwargs or {}
            )
        else:
            values["payload"] = self.payload
        if self.key:
            values["key"] = self.key
        return values

    def clean(self) -> None:
        from django_delayqueue.conf.settings import queue_names
        from django_delayqueue.core.recurring.recurrence import Recurrence

        try:
            Recurrence.from_mapping(self.name, self.definition())
        except ConfigurationError as e:
            raise ValidationError(str(e)) from e
        if self.queue not in queue_names():
            raise ValidationError(
                {"queue": f"{self.queue!r} is not a configured queue: no runqueue would keep it."}
            )
        try:
            shards = queue_shards(self.queue)
        except ConfigurationError:  # reported by the queue checks
            return
        problem = keyed_schedule_problem(self.name, self.key or None, shards)
        if problem:
            raise ValidationError({"key": problem})


class InboxEntry(models.Model):
    """A delivery of an atomic queue whose handler's transaction committed (docs/exactly-once.md).

    Inserted in the handler's own transaction, so it exists if and only if the handler's
    database work committed: a redelivery of the message (its consumer died before the ack)
    finds it and is acknowledged without running the handler again. The scheduled time tells
    this message from a later one that reuses its id. Pruned by ``runqueue``'s maintenance
    once the message is gone from Redis and the row is older than ``INBOX_KEEP_SECONDS``.
    """

    queue = models.CharField(max_length=100)
    message_id = models.CharField("message id", max_length=MAX_ID_LENGTH)
    scheduled_ms = models.BigIntegerField(help_text="When it was scheduled, ms since the epoch.")
    done_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = "inbox entry"
        verbose_name_plural = "inbox entries"
        default_permissions = ("view",)
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "message_id", "scheduled_ms"], name="delayqueue_inbox_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.message_id}@{self.scheduled_ms}"
