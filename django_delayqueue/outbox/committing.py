"""Sending a message when the transaction that scheduled it commits (and never if it rolls back).

With ``DELAYQUEUE['OUTBOX']`` (the default) the message is also written as an outbox row in that
transaction: sent and deleted right after the commit, or, if Redis cannot take it then, left
for ``runqueue``'s relay. Without it, a send that fails after the commit is logged at ERROR with
everything needed to send it again: the database committed, and nobody is left to raise to.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router, transaction
from django.db.models import F
from django.utils import timezone as django_timezone

from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.errors import DelayQueueError, NotReplicated
from django_delayqueue.core.results import ScheduleResult
from django_delayqueue.inbox import delivery_alias
from django_delayqueue.observability.log_fields import id_fields
from django_delayqueue.outbox.outgoing import Outgoing

if TYPE_CHECKING:
    from django.db.models import Manager

    from django_delayqueue.models import OutboxMessage

logger = logging.getLogger("django_delayqueue.outbox")
# What became of a schedule is told where it always was: the API's logger.
api_logger = logging.getLogger("django_delayqueue.api")


def send_on_commit(
    outgoing: Outgoing,
    *,
    on_commit: bool,
    using: str | None = None,
    then: Callable[[], None] | None = None,
) -> None:
    """Send ``outgoing`` now, or when the open transaction of ``using`` commits (``on_commit``).

    ``then`` runs once the message is safe: in Redis, or, after a commit, in the outbox. Outside
    an atomic block (or with ``on_commit`` False) the send happens at once and its error reaches
    the caller, as it should: nothing was committed on its behalf.
    """
    # In an atomic queue's handler (django_delayqueue.inbox) the default is its database,
    # and the outbox is used whatever OUTBOX says: the next message of a chain then exists if
    # and only if this delivery's transaction (its effects and its inbox row) commits.
    delivering = delivery_alias()
    alias = using or delivering or DEFAULT_DB_ALIAS
    if not (on_commit and transaction.get_connection(alias).in_atomic_block):
        log_result(outgoing.send(), outgoing.queue.name)
        if then is not None:
            then()
        return
    if (dq_settings.OUTBOX or alias == delivering) and holds_outbox(alias):
        row = write_row(outgoing, alias)
        transaction.on_commit(lambda: _send_committed_row(outgoing, row, alias, then), using=alias)
    else:
        transaction.on_commit(lambda: _send_committed(outgoing, then), using=alias)


def holds_outbox(alias: str) -> bool:
    """Whether database ``alias`` has the outbox table: the routers let this app migrate there
    (never Django's dummy backend of a project without databases)."""
    from django_delayqueue.models import OutboxMessage

    engine = connections.settings[alias].get("ENGINE", "")
    if not engine or engine == "django.db.backends.dummy":
        return False
    return bool(router.allow_migrate_model(alias, OutboxMessage))


def rows(using: str) -> Manager[OutboxMessage]:
    """The outbox table of database ``using`` (imported here: ``dq.schedule``'s module must
    import before the app registry is ready, a model must not)."""
    from django_delayqueue.models import OutboxMessage

    return OutboxMessage.objects.db_manager(using)


def write_row(outgoing: Outgoing, using: str) -> OutboxMessage:
    """The outbox row of ``outgoing``, written in the open transaction of ``using``.

    It is leased to this process for ``OUTBOX_LEASE_SECONDS``: the relay leaves it alone while
    the commit path sends it (or dies: then the relay sends it when the lease is over).
    """
    now = django_timezone.now()
    prepared = outgoing.prepared
    return rows(using).create(
        queue=outgoing.queue.name,
        message_id=prepared.id,
        due_ms=prepared.due_ms,
        envelope=prepared.envelope,
        mode=outgoing.mode,
        record=outgoing.record or "",
        priority=outgoing.priority,
        unique_ms=outgoing.unique_ms or None,  # None: no window, as an older process writes
        created_at=now,
        leased_until=now + timedelta(seconds=float(dq_settings.OUTBOX_LEASE_SECONDS)),
    )


def _send_committed_row(
    outgoing: Outgoing, row: OutboxMessage, using: str, then: Callable[[], None] | None
) -> None:
    try:
        result = outgoing.send_once(str(row.pk))
    except DelayQueueError as e:
        logger.warning(
            "queue %s: message %s kept in the outbox (Redis did not take it after the "
            "commit: %s); runqueue's relay sends it when Redis is back",
            outgoing.queue.name,
            row.message_id,
            e,
            extra=id_fields(outgoing.queue.name, row.message_id),
        )
        release(row, using, e)
    else:
        if result is not None:
            log_result(result, outgoing.queue.name)
        delete_sent(row, using)
    if then is not None:
        then()


def release(row: OutboxMessage, using: str, error: Exception, *, wait: float = 0.0) -> None:
    """Count a failed send of ``row`` and let a relay take it in ``wait`` seconds (best effort:
    if the database fails too, the row's lease runs out and a relay takes it then)."""
    until = django_timezone.now() + timedelta(seconds=wait) if wait > 0 else None
    try:
        rows(using).filter(pk=row.pk).update(
            leased_until=until, attempts=F("attempts") + 1, last_error=str(error)[:2000]
        )
    except DatabaseError as e:
        logger.warning("outbox row %s not released (it waits for its lease): %s", row.pk, e)


def delete_sent(row: OutboxMessage, using: str) -> None:
    """Delete the row of a message Redis has (best effort: a relay's later send of a row left
    behind stores nothing, its token being known)."""
    try:
        rows(using).filter(pk=row.pk).delete()
    except DatabaseError as e:
        logger.warning("outbox row %s sent but not deleted: %s", row.pk, e)


def _send_committed(outgoing: Outgoing, then: Callable[[], None] | None) -> None:
    """Without the outbox: send after the commit; a failure can only be logged."""
    try:
        result = outgoing.send()
    except NotReplicated as e:  # written, only not confirmed: not lost, but not safe either
        api_logger.warning(
            "queue %s: message %s was sent after the commit but not confirmed by its "
            "replicas (it would be lost if the primary failed over now): %s",
            outgoing.queue.name,
            outgoing.prepared.id,
            e,
            extra=id_fields(outgoing.queue.name, outgoing.prepared.id),
        )
        return
    except DelayQueueError as e:
        _log_lost(outgoing, e)
        return
    log_result(result, outgoing.queue.name)
    if then is not None:
        then()


def _log_lost(outgoing: Outgoing, error: Exception) -> None:
    """Log at ERROR a message whose send after a commit failed: id, due time and payload."""
    queue = outgoing.queue.name
    message_id, due_ms, envelope = outgoing.prepared
    payload = decode_envelope(envelope)[2]
    payload_json = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    try:
        due = datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):  # the very end of year 9999: keep logging
        due = "beyond datetime"
    api_logger.error(
        "queue %s: message %s (due %s, %d ms) was not sent after the transaction committed "
        "and is lost (DELAYQUEUE['OUTBOX'] would have kept it): %s; payload: %s",
        queue,
        message_id,
        due,
        due_ms,
        error,
        payload_json,
        extra={
            **id_fields(queue, message_id),
            "delayqueue": {
                "queue": queue,
                "id": message_id,
                "due_ms": due_ms,
                "payload": payload_json,
            },
        },
    )


def log_result(result: ScheduleResult, queue: str) -> None:
    """Never silent: a message that was not created is logged with what kept it out."""
    if result.within_window:
        api_logger.info(
            "not scheduled %s on %s: its uniqueness window (unique_for) is open until %s%s",
            result.id,
            queue,
            _when(result.unique_until_ms),
            f" (a message with this id is {result.state})" if result.state else "",
            extra=id_fields(queue, result.id),
        )
    elif not result.created:
        api_logger.info(
            "not scheduled %s on %s: a message with this id is already %s "
            "(replace=True replaces it)",
            result.id,
            queue,
            result.state,
            extra=id_fields(queue, result.id),
        )
    elif result.successor:
        api_logger.debug(
            "scheduled %s on %s after its delivery in flight",
            result.id,
            queue,
            extra=id_fields(queue, result.id),
        )
    elif result.replaced:
        api_logger.debug(
            "scheduled %s on %s, replacing one %s",
            result.id,
            queue,
            result.state,
            extra=id_fields(queue, result.id),
        )
    elif api_logger.isEnabledFor(logging.DEBUG):  # its extra is built only for a line logged
        api_logger.debug("scheduled %s on %s", result.id, queue, extra=id_fields(queue, result.id))


def _when(ms: int | None) -> str:
    """Epoch milliseconds as an ISO 8601 UTC instant, for a log line."""
    try:
        return datetime.fromtimestamp((ms or 0) / 1000, tz=timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):  # the very end of year 9999
        return f"{ms} ms"
