"""The admin of recurring schedules: the rows, where each stands in Redis, and "Run now".

A save or delete is published on commit; every runqueue picks it up within
``SETTINGS_REFRESH_SECONDS``: an edited schedule's waiting tick is replaced, a deleted
schedule's is withdrawn. "Run now" sends one extra tick at once (``change`` permission).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.http import HttpRequest

from django_delayqueue.admin.fields import SecondsField
from django_delayqueue.conf.connection import get_clock
from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.envelope import ms_to_datetime
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, PayloadError
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.mirror.recurrences import read_definitions
from django_delayqueue.models import RecurringSchedule
from django_delayqueue.monitoring.recurrences import RecurrenceStatus, invalid_status, statuses

OUTCOMES = {"ack": "succeeded", "retry": "failed (will retry)", "garbage": "failed (dead letter)"}


@admin.register(RecurringSchedule)
class RecurringScheduleAdmin(admin.ModelAdmin):
    list_display = ["name", "queue", "when", "paused", "next_run", "last_run", "last_outcome"]
    list_editable = ["paused"]
    list_filter = ["queue", "paused"]
    search_fields = ["name", "task"]
    actions = ["run_now"]
    readonly_fields = ["updated_at", "from_settings"]
    # 'every' is the row's one float: a number of seconds, "nan" and "inf" refused by name.
    formfield_overrides = {models.FloatField: {"form_class": SecondsField}}
    fieldsets = [
        (None, {"fields": ["name", "queue", "paused"]}),
        ("When", {"fields": ["cron", "every", "timezone", ("catch_up", "catch_up_limit")]}),
        ("What", {"fields": ["payload", ("task", "backend"), "args", "kwargs", "key"]}),
        (None, {"fields": ["updated_at", "from_settings"]}),
    ]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        # One Redis round trip for the page's rows, not one per cell.
        rows = list(changelist.result_list)
        # A row stored past validation (an update(), an older release) is listed with its
        # problem, not run.
        recurrences, invalid = read_definitions({row.name: row.definition() for row in rows})
        found = {s.name: s for s in statuses(recurrences)}
        found.update((i.name, invalid_status(i.name, i.options, i.error)) for i in invalid)
        for row in rows:  # on this request's row objects: the ModelAdmin is shared by threads
            row.dq_status = found.get(row.name)
        return changelist

    @staticmethod
    def _status(row: RecurringSchedule) -> RecurrenceStatus | None:
        return getattr(row, "dq_status", None)

    def delete_model(self, request: HttpRequest, obj: RecurringSchedule) -> None:
        self._warn_settings_rows(request, [obj])
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        self._warn_settings_rows(request, list(queryset))
        super().delete_queryset(request, queryset)

    def _warn_settings_rows(self, request: HttpRequest, rows: list[RecurringSchedule]) -> None:
        names = [row.name for row in rows if row.from_settings]
        if names:
            self.message_user(
                request,
                f"{', '.join(names)} come(s) from DELAYQUEUE['SCHEDULES']: the next migrate or "
                "runqueue start re-creates it. Remove it from the settings file, or pause it.",
                messages.WARNING,
            )

    @admin.display(description="when")
    def when(self, row: RecurringSchedule) -> str:
        if row.cron:
            return f"cron {row.cron} ({row.timezone})"
        return "-" if row.every is None else f"every {row.every:g}s"

    @admin.display(description="next run")
    def next_run(self, row: RecurringSchedule) -> Any:
        s = self._status(row)
        if s is None or s.error:
            return s.error[:200] if s else "invalid"
        if s.next_run_ms is None:
            return "paused"
        when = _to_the_second(s.next_run_ms)
        return when if s.next_is_waiting else f"{when} (no runqueue has scheduled it yet)"

    @admin.display(description="last run")
    def last_run(self, row: RecurringSchedule) -> Any:
        s = self._status(row)
        return _to_the_second(s.last_tick_ms) if s and s.last_tick_ms else "never"

    @admin.display(description="outcome")
    def last_outcome(self, row: RecurringSchedule) -> str:
        s = self._status(row)
        if s is None or not s.last_outcome:
            return "-"
        text = OUTCOMES.get(s.last_outcome, s.last_outcome)
        return f"{text}: {s.last_error}" if s.last_error else text

    @admin.action(description="Run selected schedules now (one extra tick)", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        from django_delayqueue.worker import tick_key, tick_payload

        sent, failed = [], []
        for row in queryset:
            try:
                recurrence = Recurrence.from_mapping(row.name, row.definition())
                now = get_clock().now_ms()
                get_queue(recurrence.queue).schedule(
                    tick_payload(recurrence, now),
                    id=recurrence.tick_id(now),
                    key=tick_key(recurrence),
                )
                sent.append(row.name)
            except (ConfigurationError, DelayQueueError, PayloadError) as e:
                failed.append(f"{row.name}: {e}")
        if sent:
            self.message_user(request, f"Sent a tick of {', '.join(sent)} now.", messages.SUCCESS)
        for problem in failed:
            self.message_user(request, f"Not sent: {problem}", messages.ERROR)


def _to_the_second(ms: int) -> str:
    """In the site's time zone, to the second: schedules may tick every few seconds."""
    from django.utils import timezone

    return timezone.localtime(ms_to_datetime(ms)).strftime("%Y-%m-%d %H:%M:%S %Z")
