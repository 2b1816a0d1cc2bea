"""The "Delay queues" admin pages: the overview, a page per queue, and the report's charts.

Wired by :class:`~django_delayqueue.admin.QueueMessageAdmin` (whose ``admin_view`` wrapper
keeps out anonymous and non-staff users). Every page checks the view permission, every action
its own permission too; actions are POST only (CSRF-checked by the middleware) and redirect
back to the page they came from. Redis errors become an error message on the page, not a 500.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
)
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.text import Truncator

from django_delayqueue.admin import charts, running, task_rows
from django_delayqueue.admin.actions import ACTIONS, ALL_ACTIONS
from django_delayqueue.admin.common import (
    APP,
    CHANGE_CONFIG,
    action_url,
    base_context,
    button,
    page_number,
    queue_url,
    require_queue,
    require_view,
)
from django_delayqueue.api import get_queue
from django_delayqueue.conf.queues import queue_settings
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core import STATES, DelayQueueError, PeekedMessage
from django_delayqueue.core.dead_letters import DeadLetterReasons, reasons_of
from django_delayqueue.core.envelope import decode_envelope, ms_to_datetime
from django_delayqueue.core.errors import CorruptEnvelope
from django_delayqueue.core.server_info import ServerInfo
from django_delayqueue.models import QueueConfig
from django_delayqueue.monitoring import attention
from django_delayqueue.monitoring.lateness import format_ms
from django_delayqueue.monitoring.servers import (
    NOT_PERSISTENT,
    app_servers,
    findings,
    memory_text,
)
from django_delayqueue.monitoring.stats import QueueStats, collect, format_seconds
from django_delayqueue.spark.chart_files import CHART_KINDS, chart_path

logger = logging.getLogger(__name__)

PER_PAGE = 50
PREVIEW_CHARS = 120  # payload shown in the table; the full JSON (capped) is in the tooltip
TOOLTIP_CHARS = 2000

STATE_LABELS = {
    "pending": "Pending",
    "ready": "Ready",
    "unack": "In flight",
    "retry": "Retrying",
    "garbage": "Dead letters",
}
# What a state's zset score means ("ready" is a list: no score).
# Pending's score is its due time, already a column of its own.
SCORE_LABELS = {"unack": "Deadline", "retry": "Retry at", "garbage": "Died"}


# --- pages -----------------------------------------------------------------------------------


def overview(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Every queue: what needs attention in words, then counts per state, how late, paused,
    consumers, totals; the details (charts, processes, limits) are on each queue's page."""
    require_view(model_admin, request)
    site = model_admin.admin_site.name
    all_stats = collect()
    found = [f for s in all_stats for f in attention.findings(s, _time_limit(s.queue))]
    found.sort(key=lambda f: attention.SEVERITIES.index(f.severity))
    worst: dict[str, str] = {}  # each queue's most severe finding
    for f in found:
        worst.setdefault(f.queue, f.severity)
    rows = [{**_overview_row(site, s), "attention": worst.get(s.queue)} for s in all_stats]
    errors = sorted({e for s in all_stats for e in s.errors})
    formats = [b for s in all_stats if (b := _formats_banner(site, s))]
    servers = app_servers()
    banners = _server_banners(servers)
    troubles = [*errors, *(b["text"] for b in formats), *(b["text"] for b in banners if b["error"])]
    context = {
        **base_context(model_admin, request, "Delay queues"),
        "rows": rows,
        "attention": [_group(site, g) for g in attention.grouped(found)],
        "calm": _calm(all_stats, troubles),
        "states": [(s, STATE_LABELS[s]) for s in STATES],
        "errors": errors,
        "start_failures": _start_failures(all_stats),
        "outbox": _outbox_summary(site, request),
        "servers": [_server_row(s) for s in servers],
        "server_banners": banners,
        "format_banners": formats,
    }
    return TemplateResponse(request, "admin/django_delayqueue/overview.html", context)


def _formats_banner(site: str, s: QueueStats) -> dict[str, Any] | None:
    """What the overview says of a queue whose messages wait for a newer consumer, or whose
    live consumers are older than this release (docs/upgrades.md); None: neither."""
    f = s.formats
    if f is None:
        return None
    said = [text for text in (f.waiting_text(), f.older_text()) if text]
    if not said:
        return None
    text = "; ".join(said) + "."
    if f.waiting:
        text += (
            " They are not dead-lettered: they wait in Retrying, and a runqueue that reads "
            "their format delivers them (docs/upgrades.md)."
        )
    return {
        "queue": s.queue,
        "url": queue_url(site, s.queue, "retry"),
        "text": text,
        "stuck": f.stuck,
    }


def _time_limit(queue: str) -> float | None:
    """The queue's time_limit as its consumers read it (published settings, refreshed at most
    every SETTINGS_REFRESH_SECONDS: no round trip per page)."""
    try:
        return queue_settings(queue).time_limit
    except DelayQueueError:  # unreadable settings are reported by the checks and the stats
        return None


def _group(site: str, g: attention.Group) -> dict[str, Any]:
    """A line of findings: each queue linked to its page's tab that shows it (with its own
    sentence as the link's title when several share the line)."""
    return {
        "kind": g.kind,
        "severity": g.severity,
        "text": g.text,
        "queues": [
            {"name": f.queue, "url": queue_url(site, f.queue, f.state or "pending"), "said": f.text}
            for f in g.findings
        ],
    }


def _calm(all_stats: list[QueueStats], banners: list[str]) -> str | None:
    """What the overview says when nothing needs attention (None: it says nothing, as when
    a banner above says something is wrong)."""
    if banners or not all_stats:
        return None
    return (
        "Nothing needs attention: every queue has a live consumer, none is behind or late, "
        "and none keeps dead letters."
    )


def _start_failures(all_stats: list[QueueStats]) -> list[dict[str, Any]]:
    """One banner per distinct "consumers keep dying at start" text, with its queues."""
    texts = sorted({f for s in all_stats for f in s.start_failures})
    return [
        {"text": t, "queues": [s.queue for s in all_stats if t in s.start_failures]} for t in texts
    ]


def _server_row(s: ServerInfo) -> dict[str, Any]:
    return {
        "address": s.address,
        "version": s.version,
        "memory": memory_text(s) if s.ok else None,
        "full": s.out_of_memory,
        "policy": s.policy,
        "evicts": s.evicts,
        "persistence": s.persistence if s.ok else None,
        "error": s.error,
    }


def _server_banners(servers: list[ServerInfo]) -> list[dict[str, Any]]:
    """What the overview says above the queues while it holds: a policy that evicts
    messages, a server that keeps nothing on disk, a server out of memory."""
    banners = [
        {"kind": f.kind, "text": f"{f.message} {f.hint}", "error": f.kind != NOT_PERSISTENT}
        for f in findings(servers)
    ]
    banners += [
        {
            "kind": "out-of-memory",
            "text": f"Redis {s.address} is out of memory ({memory_text(s)}): new messages are "
            "refused (deliveries and acks go on, and free memory). Raise its maxmemory, or let "
            "the consumers drain the queues.",
            "error": True,
        }
        for s in servers
        if s.ok and s.out_of_memory
    ]
    return banners


def _outbox_summary(site: str, request: HttpRequest) -> dict[str, Any] | None:
    """The outbox backlog of every database (None when nothing waits), with its link."""
    from django_delayqueue.conf.settings import dq_settings
    from django_delayqueue.outbox.backlog import outbox_backlog

    backlogs = [b for b in outbox_backlog() if b.count]
    if not backlogs:
        return None
    age = max(b.age_seconds() for b in backlogs)
    url = None
    if request.user.has_perm("django_delayqueue.view_outboxmessage"):
        url = reverse(f"{site}:django_delayqueue_outboxmessage_changelist")
    return {
        "count": sum(b.count for b in backlogs),
        "age": format_seconds(age),
        "late": age > float(dq_settings.OUTBOX_MAX_AGE_SECONDS),
        "error": next((b.last_error for b in backlogs if b.last_error), ""),
        "url": url,
    }


def queue_page(model_admin: ModelAdmin, request: HttpRequest, queue: str) -> HttpResponse:
    """One queue: its numbers, pause/resume, and a page of messages in one state."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    require_view(model_admin, request)
    require_queue(queue)
    site = model_admin.admin_site.name
    state = request.GET.get("state") or "pending"
    if state not in STATES:
        raise Http404(f"unknown state {state!r}")
    (stats,) = collect([queue])
    time_limit = _time_limit(queue)
    total = stats.counts[state]
    pages = max(1, -(-(total or 0) // PER_PAGE))
    page = min(page_number(request.GET.get("p")), pages)
    errors = list(stats.errors)
    rows: list[dict[str, Any]] = []
    has_tasks = False
    reasons = None
    try:
        q = get_queue(queue)
        time_limit = q.settings.time_limit
        if state == "garbage" and stats.counts["garbage"]:
            reasons = _reason_groups(site, queue, reasons_of(q))
        peeked = q.peek(state, (page - 1) * PER_PAGE, PER_PAGE)
        rows = [_message_row(m) for m in peeked.messages]
        has_tasks = task_rows.annotate(q, rows)
        if state == "unack":
            running.annotate_running(rows, stats, time_limit)
        total = peeked.total
        pages = max(1, -(-total // PER_PAGE))
    except DelayQueueError as e:
        errors.append(f"messages: {e}")
    user = request.user
    offered = [
        (name, a) for name, a in ACTIONS.items() if state in a.states and user.has_perm(a.perm)
    ]
    context = {
        **base_context(model_admin, request, f"Queue {queue}"),
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
                "url": queue_url(site, queue, s),
                "current": s == state,
            }
            for s in STATES
        ],
        "rows": rows,
        "has_tasks": has_tasks,
        "score_label": SCORE_LABELS.get(state),
        "show_reason": state in ("retry", "garbage"),
        "row_actions": [button(site, queue, name, a.label) for name, a in offered],
        "all_actions": [
            button(site, queue, n, f"{a.label} all…") for n, a in offered if n in ALL_ACTIONS
        ],
        "page": page,
        "pages": pages,
        "total": total,
        "previous_url": queue_url(site, queue, state, page - 1) if page > 1 else None,
        "next_url": queue_url(site, queue, state, page + 1) if page < pages else None,
        "pause_action": _pause_button(site, request, queue, stats),
        "settings_url": _settings_url(site, request, queue),
        "charts": _chart_urls(site, queue),
        "live_charts": charts.queue_charts(stats, stats.flow.limited),
        "attention": [
            _group(site, g) for g in attention.grouped(attention.findings(stats, time_limit))
        ],
        "reasons": reasons,
        "reason_actions": [
            (name, a.label) for name, a in offered if name in ALL_ACTIONS and "garbage" in a.states
        ],
        "errors": errors,
        "start_failures": stats.start_failures,
        "show_running": state == "unack",
        "stalled": len(running.stalled_ids(stats, time_limit)),
        "time_limit": None if time_limit is None else format_seconds(time_limit),
        "supervisors": running.processes_context(stats),
        "flow": stats.flow,
        "busiest_keys": stats.busiest_keys,
        "formats": _formats_banner(site, stats),
    }
    return TemplateResponse(request, "admin/django_delayqueue/queue.html", context)


def _reason_groups(site: str, queue: str, found: DeadLetterReasons) -> dict[str, Any]:
    """The dead letters by reason, each group with what its buttons post."""
    return {
        "total": found.total,
        "read": found.read,
        "partial": found.partial,
        "groups": [
            {
                "reason": g.reason,
                "short": Truncator(g.reason or "(no reason given)").chars(PREVIEW_CHARS),
                "count": g.count,
                "newest": ms_to_datetime(g.newest_ms),
            }
            for g in found.groups
        ],
        "urls": {name: action_url(site, queue, name) for name in ALL_ACTIONS},
    }


def chart(model_admin: ModelAdmin, request: HttpRequest, queue: str, kind: str) -> FileResponse:
    """A PNG chart of the last ``queue_report`` (``DELAYQUEUE["REPORT_DIR"]``), for viewers."""
    require_view(model_admin, request)
    require_queue(queue)
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


def _overview_row(site: str, s: QueueStats) -> dict[str, Any]:
    return {
        "name": s.queue,
        "url": queue_url(site, s.queue, "pending"),
        "counts": [
            {"state": st, "value": s.counts[st], "url": queue_url(site, s.queue, st)}
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
        "already_done": s.already_done,
        "lateness": s.lateness,  # p50/p99 start lateness (monitoring.lateness), may be None
        "late_p50": _ms(s.lateness.p50_5m if s.lateness else None),
        "late_p99": _ms(s.lateness.p99_5m if s.lateness else None),
        "ok": s.ok,
    }


def _ms(value: float | None) -> str | None:
    return None if value is None else format_ms(value)


def _due_in(s: QueueStats) -> str:
    if s.next_due_ms is None:
        return "—"
    if s.next_due_ms <= s.now_ms:
        return "due now"
    return "in " + format_seconds((s.next_due_ms - s.now_ms) / 1000)


def _message_row(m: PeekedMessage) -> dict[str, Any]:
    due: int | None
    scheduled: int | None
    try:
        due, scheduled, payload = decode_envelope(m.envelope)
    except CorruptEnvelope:  # shown as stored, so staff can see what is wrong with it
        due = scheduled = payload = None
        text = m.envelope
    else:
        text = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    return {
        "id": m.id,
        "payload": payload,
        "preview": Truncator(text).chars(PREVIEW_CHARS),
        "full": Truncator(text).chars(TOOLTIP_CHARS),
        "corrupt": due is None,
        "due_at": None if due is None else ms_to_datetime(due),
        "scheduled_at": None if scheduled is None else ms_to_datetime(scheduled),
        "when": None if m.score_ms is None else ms_to_datetime(m.score_ms),
        "attempts": m.attempts,
        "reason": m.reason,
    }


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
    return button(site, queue, action, ACTIONS[action].label)
