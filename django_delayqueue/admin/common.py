"""What every "Delay queues" admin page shares: permission names and checks, URLs, and the
base template context."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
)
from django.urls import NoReverseMatch, reverse

from django_delayqueue.conf.settings import queue_names

APP = "django_delayqueue"


VIEW, CHANGE, DELETE = (
    f"{APP}.view_queuemessage",
    f"{APP}.change_queuemessage",
    f"{APP}.delete_queuemessage",
)


CHANGE_CONFIG = f"{APP}.change_queueconfig"


def require_view(model_admin: ModelAdmin, request: HttpRequest) -> None:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def require_queue(queue: str) -> None:
    if queue not in queue_names():
        raise Http404(f"no configured queue {queue!r}")


def base_context(model_admin: ModelAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
    opts = model_admin.opts
    site = model_admin.admin_site.name
    user = request.user
    config_url = None
    if user.has_perm(f"{APP}.view_queueconfig") or user.has_perm(CHANGE_CONFIG):
        try:
            config_url = reverse(f"admin:{APP}_queueconfig_changelist", current_app=site)
        except NoReverseMatch:  # QueueConfig is not registered on this site
            config_url = None
    return {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "title": title,
        "overview_url": reverse(f"admin:{APP}_queuemessage_changelist", current_app=site),
        "config_url": config_url,
    }


def page_number(value: str | None) -> int:
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1


def queue_url(site: str, queue: str, state: str, page: int = 1) -> str:
    url = reverse(f"admin:{APP}_queuemessage_queue", args=[queue], current_app=site)
    query = {"state": state, **({"p": page} if page > 1 else {})}
    return f"{url}?{urlencode(query)}"


def action_url(site: str, queue: str, action: str) -> str:
    return reverse(f"admin:{APP}_queuemessage_action", args=[queue, action], current_app=site)


def button(site: str, queue: str, action: str, label: str) -> dict[str, str]:
    return {"action": action, "label": label, "url": action_url(site, queue, action)}
