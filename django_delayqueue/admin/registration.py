"""The admin: the "Delay queues" monitoring pages and the queue settings rows.

The monitoring pages hang off ``QueueMessage``, a model without a table that exists for its
permissions (the django-rq way): its changelist is the overview of every queue, and
:meth:`QueueMessageAdmin.get_urls` adds a page per queue and the POST-only actions.

Permissions: the pages need ``view_queuemessage`` (or ``change_queuemessage``, which implies
view everywhere in the admin); requeue, cancel and run-now need ``change_queuemessage``;
deleting dead letters needs ``delete_queuemessage``; pause/resume needs
``change_queueconfig``. ``admin_site.admin_view`` sends anonymous and non-staff users to the
login page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import URLPattern, path

from django_delayqueue.admin import actions as admin_actions
from django_delayqueue.admin import views as admin_views
from django_delayqueue.admin.fields import SecondsField
from django_delayqueue.core.envelope import decode_envelope_parts, ms_to_datetime
from django_delayqueue.core.errors import CorruptEnvelope
from django_delayqueue.mirror.queue_overrides import MIRRORED_FIELDS
from django_delayqueue.models import OutboxMessage, QueueConfig, QueueMessage


@admin.register(QueueMessage)
class QueueMessageAdmin(admin.ModelAdmin):
    """Monitoring pages: an overview of all queues, then one page per queue."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        # Only our pages: the default add/change/delete views make no sense without a table.
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path(
                "<str:queue>/",
                wrap(self.queue_view),
                name="{}_{}_queue".format(*info),
            ),
            path(
                "<str:queue>/charts/<slug:kind>.png",
                wrap(self.chart_view),
                name="{}_{}_chart".format(*info),
            ),
            path(
                "<str:queue>/<slug:action>/",
                wrap(self.action_view),
                name="{}_{}_action".format(*info),
            ),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return admin_views.overview(self, request)

    def queue_view(self, request: HttpRequest, queue: str) -> HttpResponse:
        return admin_views.queue_page(self, request, queue)

    def chart_view(self, request: HttpRequest, queue: str, kind: str) -> HttpResponseBase:
        return admin_views.chart(self, request, queue, kind)

    def action_view(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        return admin_actions.queue_action(self, request, queue, action)


@admin.register(QueueConfig)
class QueueConfigAdmin(admin.ModelAdmin):
    """The queue settings staff may tune; a save is published to running processes."""

    # Every setting staff may tune (conf.settings.MIRRORED_FIELDS), the paused flag first.
    list_display = [
        "name",
        "paused",
        *(name for name in MIRRORED_FIELDS if name != "paused"),
        "updated_at",
    ]
    list_editable = ["paused", "max_attempts"]
    readonly_fields = ["name", "updated_at"]
    # Every float of the row is a number of seconds: "nan" and "inf" refused by name.
    formfield_overrides = {models.FloatField: {"form_class": SecondsField}}
    fields = [
        "name",
        "paused",
        "max_attempts",
        ("backoff_base", "backoff_max"),
        "visibility_timeout",
        "claim_batch",
        "concurrency",
        ("soft_time_limit", "time_limit"),
        "abort_grace_seconds",
        ("rate_limit", "max_in_flight"),
        "lateness_warning_ms",
        ("key_concurrency", "key_rate_limit"),
        "updated_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Rows follow DELAYQUEUE["QUEUES"] (mirror.kinds.queue_settings_mirror); a row for a
        # queue the settings do not declare would configure nothing.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    """Messages committed while Redis was down, waiting for a relay (read-only).

    Deleting a row discards its message; "Send now" relays the selected rows at once (both
    need ``delete_outboxmessage``: each removes the row).
    """

    list_display = [
        "message_id",
        "queue",
        "mode",
        "due",
        "flow_key",
        "created_at",
        "attempts",
        "relayed_at",
        "short_error",
    ]
    list_filter = ["queue", "mode"]
    search_fields = ["message_id"]
    actions = ["send_now"]
    readonly_fields = [f.name for f in OutboxMessage._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="due", ordering="due_ms")
    def due(self, row: OutboxMessage) -> Any:
        try:
            return ms_to_datetime(row.due_ms)
        except (OverflowError, ValueError, OSError):  # the very end of year 9999
            return f"{row.due_ms} ms"

    @admin.display(description="flow key")
    def flow_key(self, row: OutboxMessage) -> str:
        """The key the row's envelope carries (no column of its own: the envelope is what
        Redis will store, so it cannot disagree with it)."""
        try:
            return decode_envelope_parts(row.envelope).key or "-"
        except CorruptEnvelope:
            return "-"

    @admin.display(description="last error")
    def short_error(self, row: OutboxMessage) -> str:
        return row.last_error[:120]

    @admin.action(description="Send selected messages to Redis now", permissions=["delete"])
    def send_now(self, request: HttpRequest, queryset: Any) -> None:
        from django_delayqueue.outbox.relay import OutboxRelay

        relay = OutboxRelay(databases=[queryset.db])
        done = relay.relay_rows(queryset)
        level = messages.SUCCESS if not done.failed else messages.WARNING
        self.message_user(
            request,
            f"Sent {done.sent}, already sent {done.already_sent}, not sent {done.failed} "
            "(see each row's last error).",
            level,
        )
