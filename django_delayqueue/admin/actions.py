"""The POST actions of a queue page: run now, cancel, requeue, purge, stop, pause and resume.

Each checks the view permission and its own; all are POST only (CSRF-checked by the middleware)
and redirect back to the page they came from. Redis errors become a message, not a 500.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
)
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from django_delayqueue.admin.common import (
    CHANGE,
    CHANGE_CONFIG,
    DELETE,
    action_url,
    base_context,
    page_number,
    queue_url,
    require_queue,
    require_view,
)
from django_delayqueue.api import get_queue
from django_delayqueue.core import STATES, DelayQueueError
from django_delayqueue.core.dead_letters import ids_with_reason
from django_delayqueue.mirror.kinds import set_paused
from django_delayqueue.monitoring.stats import collect

logger = logging.getLogger(__name__)


MAX_IDS = 1000  # ids one POST may act on (Django's DATA_UPLOAD_MAX_NUMBER_FIELDS is 1000)


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
    "purge": Action(DELETE, ("garbage",), "Purge", "Purged {n} dead letter(s)."),
    "stop": Action(
        CHANGE,
        ("unack",),
        "Stop",
        "Asked {n} running message(s) to stop: they go to the dead letters (forced after the "
        "queue's abort grace period).",
    ),
    "pause": Action(CHANGE_CONFIG, (), "Pause", "Queue paused."),
    "resume": Action(CHANGE_CONFIG, (), "Resume", "Queue resumed."),
}


ALL_ACTIONS = ("requeue", "purge")  # the ones that may act on every message of a state


def queue_action(
    model_admin: ModelAdmin, request: HttpRequest, queue: str, action: str
) -> HttpResponse:
    """Run ``action`` on the posted message ids (``id``: one, ``ids``: the selected ones, or
    ``all``: every dead letter, after a confirmation page), then go back to the queue page."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require_view(model_admin, request)
    require_queue(queue)
    spec = ACTIONS.get(action)
    if spec is None:
        raise Http404(f"unknown action {action!r}")
    if not request.user.has_perm(spec.perm):
        raise PermissionDenied
    site = model_admin.admin_site.name
    state = request.POST.get("state")
    state = state if state in STATES else (spec.states[0] if spec.states else "pending")
    back = queue_url(site, queue, state, page_number(request.POST.get("p")))
    user = request.user.get_username()

    if action in ("pause", "resume"):
        set_paused(queue, action == "pause")
        logger.info("%s: %s queue %s", user, action, queue)
        messages.success(request, f"{queue}: {spec.done} Consumers follow within seconds.")
        return redirect(back)

    every = bool(request.POST.get("all"))
    # "all" of one group of dead letters (the queue page's "by reason" table): those that died
    # of this reason ('' for the ones given none).
    reason = request.POST.get("reason", "") if request.POST.get("by_reason") else None
    if every and action not in ALL_ACTIONS:
        messages.error(request, f"{spec.label} acts on selected messages only.")
        return redirect(back)
    if every and request.POST.get("confirm") != "yes":
        return _confirm_all(model_admin, request, queue, action, spec, back, reason)
    ids = [] if every else _posted_ids(request)
    if not every and not ids:
        messages.warning(request, "No messages selected: nothing was done.")
        return redirect(back)
    q = get_queue(queue)
    run = {"run-now": q.run_now, "cancel": q.cancel, "requeue": q.requeue, "purge": q.purge}
    try:
        if action == "stop":
            return _stop(request, queue, ids, back)
        if every and reason is not None:
            ids = ids_with_reason(q, reason)
            done = sum(run[action](*ids[i : i + MAX_IDS]) for i in range(0, len(ids), MAX_IDS))
        else:
            done = run[action](*ids)
    except DelayQueueError as e:
        messages.error(request, f"{spec.label} failed: {e}")
        return redirect(back)
    if reason is not None:
        logger.info("%s: %s on queue %s: %d dead of %r", user, action, queue, done, reason)
        messages.success(request, spec.done.format(n=done))
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


def _stop(request: HttpRequest, queue: str, ids: list[str], back: str) -> HttpResponse:
    """Abort each running message (``dq.abort``), with the user's name in the reason and in
    the admin log; say which were not running."""
    user = request.user.get_username()
    reason = f"stopped by {user} in the admin"
    q = get_queue(queue)
    results = [q.abort(i, reason) for i in ids]
    stopped = [r for r in results if r.running]
    for r in stopped:
        _log_change(request, queue, r.message_id, f"Stop: {reason}")
    logger.info("%s: stop on queue %s: %d of %d running", user, queue, len(stopped), len(ids))
    if stopped:
        messages.success(request, ACTIONS["stop"].done.format(n=len(stopped)))
    for r in results:
        if not r.running:
            messages.warning(request, f"Not stopped: {r.message}.")
    return redirect(back)


def _log_change(request: HttpRequest, queue: str, message_id: str, text: str) -> None:
    """An entry in the admin's log (LogEntry) for a queued message (no row of its own)."""
    from django.contrib.admin.models import CHANGE as LOG_CHANGE
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    from django_delayqueue.models import QueueMessage

    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type_id=ContentType.objects.get_for_model(QueueMessage).pk,
        object_id=f"{queue}/{message_id}"[:200],
        object_repr=f"{queue}/{message_id}"[:200],
        action_flag=LOG_CHANGE,
        change_message=text,
    )


def _confirm_all(
    model_admin: ModelAdmin,
    request: HttpRequest,
    queue: str,
    action: str,
    spec: Action,
    back: str,
    reason: str | None = None,
) -> HttpResponse:
    """The page that asks before every dead letter (or every one of ``reason``) is acted on."""
    site = model_admin.admin_site.name
    if reason is None:
        (stats,) = collect([queue])
        count = stats.counts["garbage"]
    else:
        try:
            count = len(ids_with_reason(get_queue(queue), reason))
        except DelayQueueError as e:
            messages.error(request, f"{spec.label} failed: {e}")
            return redirect(back)
    context = {
        **base_context(model_admin, request, "Are you sure?"),
        "queue": queue,
        "queue_url": queue_url(site, queue, "pending"),
        "action": action,
        "verb": "purge" if action == "purge" else "requeue",
        "label": spec.label,
        "count": count,
        "by_reason": reason is not None,
        "reason": reason,
        "action_url": action_url(site, queue, action),
        "back_url": back,
    }
    return TemplateResponse(request, "admin/django_delayqueue/confirm_all.html", context)


def _posted_ids(request: HttpRequest) -> list[str]:
    one = request.POST.get("id")
    ids = [one] if one else request.POST.getlist("ids")
    return list(dict.fromkeys(i for i in ids if i))[:MAX_IDS]
