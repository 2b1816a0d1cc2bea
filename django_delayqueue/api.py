"""What request code calls: ``schedule``, ``cancel``, ``get_queue``, and ``topic`` for handlers."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.keys import validate_name
from django_delayqueue.core.results import Prepared, ScheduleResult

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
) -> str:
    """Schedule ``payload`` on ``queue`` after ``delay`` (seconds or timedelta) or ``at``.

    Returns the message id (``id`` if given). Scheduling an id that a message still holds
    (waiting, in flight, retrying or dead) creates nothing, and says so in the log (INFO, with
    the state). With ``replace=True`` the new message replaces a waiting or dead one, or, if
    that one is being delivered, is scheduled when its delivery is acknowledged
    (docs/scheduling.md, "Re-scheduling an id"). The payload, id and due time are checked
    now, so a bad payload raises :class:`PayloadError` here. With ``on_commit`` (default
    ``DELAYQUEUE['ON_COMMIT']``, True) a call inside ``transaction.atomic`` sends the message
    only when the transaction commits, and not at all when it rolls back.
    """
    q = get_queue(queue)
    prepared = q.prepare(payload, delay=delay, at=at, id=id)
    use_on_commit = dq_settings.ON_COMMIT if on_commit is None else on_commit

    def send() -> None:
        _log_sent(q.send_prepared(prepared, replace=replace), q.name)

    send_on_commit(q.name, prepared, send, on_commit=use_on_commit, using=using)
    return prepared.id


def send_on_commit(
    queue: str,
    prepared: Prepared,
    send: Callable[[], None],
    *,
    on_commit: bool,
    using: str | None = None,
) -> None:
    """Run ``send`` now, or when the open transaction commits (``on_commit``; never on rollback).

    Shared by ``schedule`` and the Tasks backend. After a commit, a send that fails cannot raise
    to anyone who could act (the database has committed, and raising would only skip the other
    on_commit callbacks), so the message is logged at ERROR with what it takes to send it again.
    """
    # Django defers an on_commit callback exactly when an atomic block is open; otherwise it
    # runs at once, in the caller's frame, and an error reaches the caller as it should.
    after_commit = on_commit and transaction.get_connection(using).in_atomic_block

    def guarded() -> None:
        try:
            send()
        except DelayQueueError as e:
            if not after_commit:
                raise
            _log_unsent(queue, prepared, e)

    if on_commit:
        transaction.on_commit(guarded, using=using)
    else:
        guarded()


def _log_unsent(queue: str, prepared: Prepared, error: Exception) -> None:
    """Log at ERROR a message whose send after a commit failed: id, due time and payload."""
    message_id, due_ms, envelope = prepared
    payload = decode_envelope(envelope)[2]
    payload_json = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    try:
        due = datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):  # the very end of year 9999: keep logging
        due = "beyond datetime"
    logger.error(
        "queue %s: message %s (due %s, %d ms) was not sent after the transaction committed "
        "and is lost: %s; payload: %s",
        queue,
        message_id,
        due,
        due_ms,
        error,
        payload_json,
        extra={
            "delayqueue": {
                "queue": queue,
                "id": message_id,
                "due_ms": due_ms,
                "payload": payload_json,
            }
        },
    )


def _log_sent(result: ScheduleResult, queue: str) -> None:
    """Never silent: a message that was not created is logged with what kept it out."""
    if not result.created:
        logger.info(
            "not scheduled %s on %s: a message with this id is already %s "
            "(replace=True replaces it)",
            result.id,
            queue,
            result.state,
        )
    elif result.successor:
        logger.debug("scheduled %s on %s after its delivery in flight", result.id, queue)
    elif result.replaced:
        logger.debug("scheduled %s on %s, replacing one %s", result.id, queue, result.state)
    else:
        logger.debug("scheduled %s on %s", result.id, queue)


def cancel(queue: str, id: str) -> bool:
    """Remove a message that is still waiting; True if one was (False: running, gone, unknown).

    A message booked with ``replace=True`` to follow a running delivery of ``id`` is removed
    too. Runs at once, not on commit: a handler that must not act on, say, a paid order checks
    the order's state anyway (delivery is at least once).
    """
    return get_queue(queue).cancel(id) > 0


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
