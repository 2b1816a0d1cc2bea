"""What request code calls: ``schedule``, ``cancel``, ``get_queue``, and ``topic`` for handlers."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from django.dispatch import Signal

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.keys import validate_name
from django_delayqueue.core.results import AbortResult
from django_delayqueue.core.uniqueness import window_ms_of
from django_delayqueue.inbox import delivery_alias
from django_delayqueue.observability import tracing
from django_delayqueue.observability.log_fields import id_fields
from django_delayqueue.outbox.committing import send_on_commit
from django_delayqueue.outbox.outgoing import Outgoing

logger = logging.getLogger(__name__)

__all__ = ["cancel", "get_queue", "schedule", "topic", "topics"]


def schedule(
    queue: str,
    payload: Any,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    id: str | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    replace: bool = False,
    unique_for: float | timedelta | None = None,
    key: str | None = None,
) -> str:
    """Schedule ``payload`` on ``queue`` after ``delay`` (seconds or timedelta) or ``at``.

    Returns the message id (``id`` if given). Scheduling an id that a message still holds
    (waiting, in flight, retrying or dead) creates nothing, and says so in the log (INFO, with
    the state). With ``replace=True`` the new message replaces a waiting or dead one, or, if
    that one is being delivered, is scheduled when its delivery is acknowledged
    (docs/scheduling.md, "Re-scheduling an id"). With ``unique_for`` (seconds or a timedelta,
    with ``id``) the message opens a uniqueness window for its id when it is stored, and
    another schedule with ``unique_for`` of the id is refused (and logged at INFO) while the
    window is open, even after the first was acknowledged (docs/flow-control.md, "Uniqueness
    windows"). With ``key`` (a non-empty str of at most 200 characters) the message has a flow
    key: the queue's ``key_concurrency`` and ``key_rate_limit`` count the messages of one key,
    and ready messages take turns by key (docs/flow-control.md, "Keys"); its handler sees
    ``message.key``. The payload, id, key, due time and window are checked now, so a bad one raises
    :class:`PayloadError` here. With ``on_commit`` (default
    ``DELAYQUEUE['ON_COMMIT']``, True) a call inside ``transaction.atomic`` sends the message
    only when the transaction commits, and not at all when it rolls back; with
    ``DELAYQUEUE['OUTBOX']`` (True) it is also written to the database in that transaction,
    so a Redis that is down at the commit delays it instead of losing it (docs/outbox.md).
    """
    # The producer span (OpenTelemetry, when configured: observability.tracing) is current as
    # the message is prepared, so its envelope carries the span's context, in the outbox row too.
    with tracing.producing(queue) as span:
        q = get_queue(queue)
        window_ms = window_ms_of(unique_for, id)
        prepared = q.prepare(payload, delay=delay, at=at, id=id, key=key)
        tracing.scheduled(span, prepared.id, prepared.due_ms)
        # In an atomic queue's handler: in its transaction, whatever ON_COMMIT says.
        use_on_commit = (
            bool(dq_settings.ON_COMMIT or delivery_alias() is not None)
            if on_commit is None
            else on_commit
        )
        outgoing = Outgoing(q, prepared, replace=replace, unique_ms=window_ms)
        send_on_commit(outgoing, on_commit=use_on_commit, using=using)
        return prepared.id


def cancel(queue: str, id: str) -> bool:
    """Remove a message that is still waiting; True if one was (False: running, gone, unknown).

    A message booked with ``replace=True`` to follow a running delivery of ``id`` is removed
    too. Runs at once, not on commit: a handler that must not act on, say, a paid order checks
    the order's state anyway (delivery is at least once).
    """
    return get_queue(queue).cancel(id) > 0


def abort(queue: str, id: str, reason: str = "") -> AbortResult:
    """Ask the handler running message ``id`` to stop; it ends in the dead letters with the
    reason "aborted: <reason>" (requeue it from there), never retried by itself.

    Cooperative first: ``message.aborted`` and ``dq.abort_requested()`` turn true in the
    handler within about a second; after the queue's ``abort_grace_seconds`` the handler is
    stopped as at its time limit. Only a message in flight is aborted: for any other the result
    is falsy and says where the message is (``result.message``), and nothing changes. Runs at
    once, not on commit.
    """
    result = get_queue(queue).abort(id, reason)
    if not result:
        logger.info("abort: %s", result.message, extra=id_fields(queue, id))
    return result


# --- one Django signal per queue ------------------------------------------------------------

_signals: dict[str, Signal] = {}
_lock = threading.Lock()


def topic(name: str) -> Signal:
    """The signal of queue ``name`` (created on first use, then always the same object).

    Receivers are called as ``receiver(sender=<queue name>, message=<Message>)``.
    """
    signal = _signals.get(name)
    if signal is None:
        validate_name(name, "queue name")
        with _lock:
            signal = _signals.setdefault(name, Signal())
    return signal


def topics() -> dict[str, Signal]:
    """Every signal created so far, by queue name (for the checks)."""
    with _lock:
        return dict(_signals)
