"""Atomic delivery (docs/exactly-once.md): a handler's database work and its inbox row commit
together, so a delivery whose transaction committed is never run again.

A queue with ``"atomic": True`` (or a database alias) runs each delivery's handlers inside
``transaction.atomic()`` on that database, after inserting the :class:`~.models.InboxEntry`
that names the message (queue, id, scheduled time). The handler returns: both commit, and the
message is acknowledged. It raises, or is stopped: both roll back. The message comes back
although its transaction committed (its consumer died before the ack): the insert meets the
row that is there (a unique constraint), the handler is not run, and the delivery is
acknowledged as "already done" (``outcomes.ALREADY_DONE`` in the journal).

While a handler runs here, :func:`delivery_alias` names its database, so that ``dq.schedule``
in it writes through the outbox in the same transaction (``outbox.committing``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from django_delayqueue.core.consumer.outcomes import SKIPPED_AS_DONE, AlreadyDone
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.queue import Queue
from django_delayqueue.observability.log_fields import message_fields

logger = logging.getLogger(__name__)

# The alias of the atomic delivery running in this thread (None: none).
_here = threading.local()
PRUNE_BATCH = 200  # inbox rows looked at (and deleted at most) per queue per maintenance


def delivery_alias() -> str | None:
    """The database of the atomic delivery whose handler runs in this thread, if any."""
    return getattr(_here, "alias", None)


def run_atomically(alias: str, message: Message, handler: Callable[[], Any]) -> Any:
    """``handler()`` in a transaction on ``alias`` with the inbox row of ``message`` (as its
    handlers see it: on its logical queue); :data:`SKIPPED_AS_DONE` without calling it when
    that row was committed before. What ``handler`` raises rolls both back and is raised."""
    from django_delayqueue.models import InboxEntry

    inserted = False
    try:
        with transaction.atomic(using=alias):
            # First: on PostgreSQL a second delivery running at once (it cannot, but a lease
            # could be misjudged) waits here on the unique index until this one ends.
            InboxEntry.objects.using(alias).create(
                queue=message.queue, message_id=message.id, scheduled_ms=message.scheduled_ms
            )
            inserted = True
            _here.alias = alias
            try:
                return handler()
            finally:
                _here.alias = None
    except IntegrityError:
        if inserted:  # the handler's own, or the commit's: a failed attempt
            raise
    logger.info(
        "queue %s: message %s already done (its transaction committed on %r before its "
        "acknowledgement was lost): acknowledged without running its handler again",
        message.queue,
        message.id,
        alias,
        extra=message_fields(message),
    )
    return SKIPPED_AS_DONE


def is_skipped(returned: Any) -> bool:
    """Whether ``returned`` is :func:`run_atomically`'s answer for a delivery already done."""
    return isinstance(returned, AlreadyDone)


def prune(alias: str, queues: Sequence[Queue], keep_seconds: float) -> int:
    """One batch of :meth:`InboxPruner.prune` from the oldest rows (no state kept)."""
    return InboxPruner().prune(alias, queues, keep_seconds)


class InboxPruner:
    """Deletes, a small batch per queue at a time, the inbox rows no redelivery can need.

    Each batch starts after the rows the previous one looked at, so rows kept for long (their
    messages dead-lettered after the commit, or on a paused queue) never stop the pruning of
    later ones; a batch that comes back short starts the next one at the oldest rows again
    (kept rows are looked at again: their messages may have gone), and so does one after a
    batch that failed. :attr:`behind` says whether the last batch of some queue was full: more
    rows may be waiting, and a worker prunes again at its next maintenance rather than a
    minute later, so that an inbox filling faster than a batch a minute does not grow for
    good."""

    def __init__(self) -> None:
        # (alias, logical queue) -> (done_at, pk) of the last row of its previous batch, while
        # that batch was full
        self._after: dict[tuple[str, str], tuple[Any, Any]] = {}

    @property
    def behind(self) -> bool:
        """Whether the last batch of some queue was full (more rows may wait)."""
        return bool(self._after)

    def prune(self, alias: str, queues: Sequence[Queue], keep_seconds: float) -> int:
        """Delete up to :data:`PRUNE_BATCH` inbox rows per queue of ``queues`` (each on its
        logical name) on ``alias`` that no redelivery can need any more: older than
        ``keep_seconds``, and whose message is no longer in Redis under that scheduled time
        (acknowledged, cancelled, purged). A message still there (retrying, dead, paused)
        keeps its row, however old: staff may requeue it. Returns the rows deleted; never
        raises (logs)."""
        from django.db.models import Q

        from django_delayqueue.models import InboxEntry

        cutoff = timezone.now() - timedelta(seconds=keep_seconds)
        deleted = 0
        by_name: dict[str, list[Queue]] = {}
        for q in queues:
            by_name.setdefault(q.logical_name, []).append(q)
        for name, shards in by_name.items():
            cursor = (alias, name)
            try:
                found = InboxEntry.objects.using(alias).filter(queue=name, done_at__lt=cutoff)
                if cursor in self._after:
                    done_at, pk = self._after[cursor]
                    found = found.filter(Q(done_at__gt=done_at) | Q(done_at=done_at, pk__gt=pk))
                rows = list(
                    found.order_by("done_at", "pk").values_list(
                        "pk", "message_id", "scheduled_ms", "done_at"
                    )[:PRUNE_BATCH]
                )
                if len(rows) < PRUNE_BATCH:
                    self._after.pop(cursor, None)
                else:
                    self._after[cursor] = (rows[-1][3], rows[-1][0])
                if not rows:
                    continue
                alive = _still_there(shards, [(pk, m, s) for pk, m, s, _ in rows])
                # -1: an envelope this release cannot read (a newer format): kept, whatever
                # its time.
                gone = [
                    pk
                    for pk, message_id, scheduled, _ in rows
                    if (message_id, scheduled) not in alive and (message_id, -1) not in alive
                ]
                if gone:
                    deleted += InboxEntry.objects.using(alias).filter(pk__in=gone).delete()[0]
            except (DatabaseError, DelayQueueError) as e:  # maintenance never fails the consumer
                # Not behind: a database or Redis that fails is asked again a minute later,
                # not at every maintenance (each a warning, and a wait on the loop's thread).
                self._after.pop(cursor, None)
                logger.warning("queue %s: inbox rows not pruned: %s", name, e)
        return deleted


def _still_there(shards: list[Queue], rows: list[tuple[Any, str, int]]) -> set[tuple[str, int]]:
    """The (id, scheduled ms) of ``rows`` whose message Redis still holds with that scheduled
    time (on whichever shard of the queue holds its id)."""
    ids = list(dict.fromkeys(message_id for _, message_id, _ in rows))
    there: set[tuple[str, int]] = set()
    for q in shards:
        for message_id, scheduled in q.scheduled_times(ids).items():
            there.add((message_id, scheduled))
    return there


def missing_table(alias: str) -> str | None:
    """The inbox table's name if database ``alias`` does not have it (None: it does)."""
    from django.db import connections

    from django_delayqueue.models import InboxEntry

    table = InboxEntry._meta.db_table
    with connections[alias].cursor() as cursor:
        names = connections[alias].introspection.table_names(cursor)
    return None if table in names else table


def require_tables(queues: dict[str, str | None]) -> None:
    """Raise ConfigurationError naming the first atomic queue (of ``queues``: name -> alias)
    whose database has no inbox table: runqueue refuses to start rather than fail each
    delivery."""
    from django_delayqueue.core.errors import ConfigurationError

    checked: dict[str, str | None] = {}
    for name, alias in queues.items():
        if alias is None:
            continue
        if alias not in checked:
            checked[alias] = missing_table(alias)
        if checked[alias]:
            raise ConfigurationError(
                f"queue {name!r} is atomic on database {alias!r}, which has no inbox table "
                f"({checked[alias]}): run `python manage.py migrate django_delayqueue`"
                + ("" if alias == "default" else f" --database {alias}")
            )
