"""The "Delay queues" admin pages: the overview, a page per queue, and the POST actions.

Wired by :class:`~django_delayqueue.admin.QueueMessageAdmin` (whose ``admin_view`` wrapper
keeps out anonymous and non-staff users). Every page checks the view permission, every action
its own permission too; actions are POST only (CSRF-checked by the middleware) and redirect
back to the page they came from. Redis errors become an error message on the page, not a 500.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
)
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.text import Truncator

from .api import get_queue
from .conf import dq_settings, queue_names
from .core import STATES, DelayQueueError, PeekedMessage
from .core.envelope import decode_envelope, ms_to_datetime
from .core.errors import CorruptEnvelope
from .mirror import set_paused
from .models import QueueConfig
from .report_files import CHART_KINDS, chart_path
from .stats import QueueStats, collect, format_seconds

logger = logging.getLogger(__name__)

PER_PAGE = 50
PREVIEW_CHARS = 120  # payload shown in the table; the full JSON (capped) is in the tooltip
TOOLTIP_CHARS = 2000
MAX_IDS = 1000  # ids one POST may act on (Django's DATA_UPLOAD_MAX_NUMBER_FIELDS is 1000)

STATE_LABELS = {
    "pending": "Pending",
    "ready": "Ready",
    "unack": "In flight",
    "retry": "Retrying",
    "garbage": "Garbage",
}
# What a state's zset score means ("ready" is a list: no score).
# Pending's score is its due time, already a column of its own.
SCORE_LABELS = {"unack": "Deadline", "retry": "Retry at", "garbage": "Died"}

APP = "django_delayqueue"
VIEW, CHANGE, DELETE = (
    f"{APP}.view_queuemessage",
    f"{APP}.change_queuemessage",
    f"{APP}.delete_queuemessage",
)
CHANGE_CONFIG = f"{APP}.change_queueconfig"


@dataclass(frozen=True)
class Action:
    perm: str
    states: tuple[str, ...]  # the states whose page offers it (none: queue-wide actions)
    label: str
    done: str  # message after it ran, formatted with the count


ACTIONS = {
    "run-now": Action(CHANGE, ("pending", "retry"), "Run now", "{n} message(s) moved to ready."),
    "cancel": Action(CHANGE, ("pending", "ready", "retry"), "Cancel", "Cancelled {n} message(s)."),
    "requeue": Action(CHANGE, ("garbage",), "Requeue", "Requeued {n} message(s) to ready."),
    "purge": Action(DELETE, ("garbage",), "Delete", "Deleted {n} dead message(s)."),
    "pause": Action(CHANGE_CONFIG, (), "Pause", "Queue paused."),
    "resume": Action(CHANGE_CONFIG, (), "Resume", "Queue resumed."),
}
ALL_ACTIONS = ("requeue", "purge")  # the ones that may act on every message of a state


# --- pages -----------------------------------------------------------------------------------


def overview(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Every queue: counts per state, oldest overdue age, paused, consumers, totals."""
    _require_view(model_admin, request)
    site = model_admin.admin_site.name
    all_stats = collect()
    rows = [_overview_row(site, s) for s in all_stats]
    errors = sorted({e for s in all_stats for e in s.errors})
    context = {
        **_base_context(model_admin, request, "Delay queues"),
        "rows": rows,
        "states": [(s, STATE_LABELS[s]) for s in STATES],
        "errors": errors,
    }
    return TemplateResponse(request, "admin/django_delayqueue/overview.html", context)


def queue_page(model_admin: ModelAdmin, request: HttpRequest, queue: str) -> HttpResponse:
    """One queue: its numbers, pause/resume, and a page of messages in one state."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    _require_view(model_admin, request)
    _require_queue(queue)
    site = model_admin.admin_site.name
    state = request.GET.get("state") or "pending"
    if state not in STATES:
        raise Http404(f"unknown state {state!r}")
    (stats,) = collect([queue])
    total = stats.counts[state]
    pages = max(1, -(-(total or 0) // PER_PAGE))
    page = min(_page_number(request.GET.get("p")), pages)
    errors = list(stats.errors)
    rows: list[dict[str, Any]] = []
    try:
        peeked = get_queue(queue).peek(state, (page - 1) * PER_PAGE, PER_PAGE)
        rows = [_message_row(m) for m in peeked.messages]
        total = peeked.total
        pages = max(1, -(-total // PER_PAGE))
    except DelayQueueError as e:
        errors.append(f"messages: {e}")
    user = request.user
    offered = [
        (name, a) for name, a in ACTIONS.items() if state in a.states and user.has_perm(a.perm)
    ]
    context = {
        **_base_context(model_admin, request, f"Queue {queue}"),
        "queue": queue,
        "stats": stats,
        "summary": _overview_row(site, stats),
        "state": state,
        "state_label": STATE_LABELS[state],
        "tabs": [
            {
                "state": s,
                "label": STATE_LABELS[s],
                "count": stats.counts[s],
                "url": _queue_url(site, queue, s),
                "current": s == state,
            }
            for s in STATES
        ],
        "rows": rows,
        "score_label": SCORE_LABELS.get(state),
        "show_reason": state in ("retry", "garbage"),
        "row_actions": [_button(site, queue, name, a.label) for name, a in offered],
        "all_actions": [
            _button(site, queue, n, f"{a.label} all…") for n, a in offered if n in ALL_ACTIONS
        ],
        "page": page,
        "pages": pages,
        "total": total,
        "previous_url": _queue_url(site, queue, state, page - 1) if page > 1 else None,
        "next_url": _queue_url(site, queue, state, page + 1) if page < pages else None,
        "pause_action": _pause_button(site, request, queue, stats),
        "settings_url": _settings_url(site, request, queue),
        "charts": _chart_urls(site, queue),
        "errors": errors,
    }
    return TemplateResponse(request, "admin/django_delayqueue/queue.html", context)


def chart(model_admin: ModelAdmin, request: HttpRequest, queue: str, kind: str) -> HttpResponse:
    """A PNG chart of the last ``queue_report`` (``DELAYQUEUE["REPORT_DIR"]``), for viewers."""
    _require_view(model_admin, request)
    _require_queue(queue)
    report_dir = dq_settings.REPORT_DIR
    path = chart_path(report_dir, queue, kind) if report_dir else None
    if path is None:
        raise Http404("no such chart: run queue_report --out REPORT_DIR")
    return FileResponse(path.open("rb"), content_type="image/png")


def _chart_urls(site: str, queue: str) -> list[dict[str, str]]:
    report_dir = dq_settings.REPORT_DIR
    if not report_dir:
        return []
    return [
        {"kind": kind, "url": reverse(f"{site}:{APP}_queuemessage_chart", args=[queue, kind])}
        for kind in CHART_KINDS
        if chart_path(report_dir, queue, kind)
    ]


# --- actions ---------------------------------------------------------------------------------


def queue_action(
    model_admin: ModelAdmin, request: HttpRequest, queue: str, action: str
) -> HttpResponse:
    """Run ``action`` on the posted message ids (``id``: one, ``ids``: the selected ones, or
    ``all``: every dead letter, after a confirmation page), then go back to the queue page."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    _require_view(model_admin, request)
    _require_queue(queue)
    spec = ACTIONS.get(action)
    if spec is None:
        raise Http404(f"unknown action {action!r}")
    if not request.user.has_perm(spec.perm):
        raise PermissionDenied
    site = model_admin.admin_site.name
    state = request.POST.get("state")
    state = state if state in STATES else (spec.states[0] if spec.states else "pending")
    back = _queue_url(site, queue, state, _page_number(request.POST.get("p")))
    user = request.user.get_username()

    if action in ("pause", "resume"):
        set_paused(queue, action == "pause")
        logger.info("%s: %s queue %s", user, action, queue)
        messages.success(request, f"{queue}: {spec.done} Consumers follow within seconds.")
        return redirect(back)

    every = bool(request.POST.get("all"))
    if every and action not in ALL_ACTIONS:
        messages.error(request, f"{spec.label} acts on selected messages only.")
        return redirect(back)
    if every and request.POST.get("confirm") != "yes":
        return _confirm_all(model_admin, request, queue, action, spec, back)
    ids = [] if every else _posted_ids(request)
    if not every and not ids:
        messages.warning(request, "No messages selected: nothing was done.")
        return redirect(back)
    q = get_queue(queue)
    run = {"run-now": q.run_now, "cancel": q.cancel, "requeue": q.requeue, "purge": q.purge}
    try:
        done = run[action](*ids)
    except DelayQueueError as e:
        messages.error(request, f"{spec.label} failed: {e}")
        return redirect(back)
    logger.info(
        "%s: %s on queue %s: %d of %s", user, action, queue, done, len(ids) if ids else "all"
    )
    text = spec.done.format(n=done)
    if ids and done < len(ids):
        missed = len(ids) - done
        verb = "was" if missed == 1 else "were"
        text += f" {missed} {verb} no longer in a state this action applies to."
    messages.success(request, text)
    return redirect(back)


def _confirm_all(
    model_admin: ModelAdmin,
    request: HttpRequest,
    queue: str,
    action: str,
    spec: Action,
    back: str,
) -> HttpResponse:
    site = model_admin.admin_site.name
    (stats,) = collect([queue])
    context = {
        **_base_context(model_admin, request, "Are you sure?"),
        "queue": queue,
        "queue_url": _queue_url(site, queue, "pending"),
        "action": action,
        "verb": "delete" if action == "purge" else "requeue",
        "label": spec.label,
        "count": stats.counts["garbage"],
        "action_url": _action_url(site, queue, action),
        "back_url": back,
    }
    return TemplateResponse(request, "admin/django_delayqueue/confirm_all.html", context)


# --- helpers ---------------------------------------------------------------------------------


def _require_view(model_admin: ModelAdmin, request: HttpRequest) -> None:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def _require_queue(queue: str) -> None:
    if queue not in queue_names():
        raise Http404(f"no configured queue {queue!r}")


def _base_context(model_admin: ModelAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
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


def _overview_row(site: str, s: QueueStats) -> dict[str, Any]:
    return {
        "name": s.queue,
        "url": _queue_url(site, s.queue, "pending"),
        "counts": [
            {"state": st, "value": s.counts[st], "url": _queue_url(site, s.queue, st)}
            for st in STATES
        ],
        "overdue": format_seconds(s.oldest_overdue_seconds),
        "overdue_seconds": s.oldest_overdue_seconds,
        "next_due": s.next_due_at,
        "next_due_in": _due_in(s),
        "paused": s.paused,
        "consumers_alive": s.consumers_alive,
        "consumers": [
            {"name": name, "seen": ms_to_datetime(seen)} for name, seen in s.consumers[:10]
        ],
        "deliveries": s.deliveries,
        "failures": s.failures,
        "ok": s.ok,
    }


def _due_in(s: QueueStats) -> str:
    if s.next_due_ms is None:
        return "—"
    if s.next_due_ms <= s.now_ms:
        return "due now"
    return "in " + format_seconds((s.next_due_ms - s.now_ms) / 1000)


def _message_row(m: PeekedMessage) -> dict[str, Any]:
    try:
        due, scheduled, payload = decode_envelope(m.envelope)
    except CorruptEnvelope:  # shown as stored, so staff can see what is wrong with it
        due = scheduled = None
        text = m.envelope
    else:
        text = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    return {
        "id": m.id,
        "preview": Truncator(text).chars(PREVIEW_CHARS),
        "full": Truncator(text).chars(TOOLTIP_CHARS),
        "corrupt": due is None,
        "due_at": None if due is None else ms_to_datetime(due),
        "scheduled_at": None if scheduled is None else ms_to_datetime(scheduled),
        "when": None if m.score_ms is None else ms_to_datetime(m.score_ms),
        "attempts": m.attempts,
        "reason": m.reason,
    }


def _posted_ids(request: HttpRequest) -> list[str]:
    one = request.POST.get("id")
    ids = [one] if one else request.POST.getlist("ids")
    return list(dict.fromkeys(i for i in ids if i))[:MAX_IDS]


def _page_number(value: str | None) -> int:
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1


def _queue_url(site: str, queue: str, state: str, page: int = 1) -> str:
    url = reverse(f"admin:{APP}_queuemessage_queue", args=[queue], current_app=site)
    query = {"state": state, **({"p": page} if page > 1 else {})}
    return f"{url}?{urlencode(query)}"


def _action_url(site: str, queue: str, action: str) -> str:
    return reverse(f"admin:{APP}_queuemessage_action", args=[queue, action], current_app=site)


def _button(site: str, queue: str, action: str, label: str) -> dict[str, str]:
    return {"action": action, "label": label, "url": _action_url(site, queue, action)}


def _settings_url(site: str, request: HttpRequest, queue: str) -> str | None:
    """The change page of the queue's settings row, for those who may see it."""
    user = request.user
    if not (user.has_perm(f"{APP}.view_queueconfig") or user.has_perm(CHANGE_CONFIG)):
        return None
    row = QueueConfig.objects.filter(name=queue).values_list("pk", flat=True).first()
    if row is None:
        return None
    try:
        return reverse(f"admin:{APP}_queueconfig_change", args=[row], current_app=site)
    except NoReverseMatch:  # QueueConfig is not registered on this site
        return None


def _pause_button(
    site: str, request: HttpRequest, queue: str, stats: QueueStats
) -> dict[str, str] | None:
    if not request.user.has_perm(CHANGE_CONFIG):
        return None
    action = "resume" if stats.paused else "pause"
    return _button(site, queue, action, ACTIONS[action].label)
