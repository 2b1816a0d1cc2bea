"""The relay: sends the outbox rows that the commit path could not, with their due times.

Every ``runqueue`` runs one (:class:`RelayThread`, a pass every ``OUTBOX_RELAY_SECONDS``); any
number may run at once. A pass claims the oldest free rows: with ``SELECT ... FOR UPDATE SKIP
LOCKED`` where the database has it (PostgreSQL, MySQL, Oracle), else one conditional ``UPDATE``
per row, so two relays never hold one row. A claimed row is leased for
``OUTBOX_LEASE_SECONDS``, sent under its token (``Queue.send_once``: a second send of a row,
after a relay died between sending and deleting it, stores nothing) and deleted. A message
already overdue goes straight to ready: delivered at once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, close_old_connections, connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.errors import DelayQueueError, RedisUnavailable
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.results import Prepared
from django_delayqueue.models import OutboxMessage
from django_delayqueue.observability.log_fields import id_fields
from django_delayqueue.outbox.committing import (
    delete_sent,
    holds_outbox,
    log_result,
    release,
    rows,
)
from django_delayqueue.outbox.outgoing import Outgoing

logger = logging.getLogger("django_delayqueue.outbox")

BATCH = 100  # rows one pass claims from one database
# Seconds before a row that failed on its own (a queue not configured here, a script error) is
# tried again; rows behind it go on meanwhile.
ROW_FAILURE_WAIT = 60.0


@dataclass
class RelayPass:
    """What one pass did: rows sent, rows whose token was sent already, rows left to retry."""

    sent: int = 0
    already_sent: int = 0
    failed: int = 0
    full: bool = False  # a database gave a whole batch and all was sent: there may be more
    redis_down: bool = False  # a send found Redis unreachable: the rest waits for the next pass

    @property
    def handled(self) -> int:
        return self.sent + self.already_sent

    def add(self, other: RelayPass) -> None:
        """Count ``other``'s rows in this pass's (``full`` and ``redis_down`` become other's)."""
        self.sent += other.sent
        self.already_sent += other.already_sent
        self.failed += other.failed
        self.full, self.redis_down = other.full, other.redis_down


def outbox_databases() -> list[str]:
    """The database aliases the outbox table may live in (as the routers allow); none in a
    project without databases (Django's dummy backend)."""
    return [alias for alias in connections if holds_outbox(alias)]


def outgoing_of(row: OutboxMessage) -> Outgoing:
    """The message a row holds, as the commit path would have sent it."""
    task = row.mode == OutboxMessage.TASK
    queue = get_queue(row.queue, task=task)  # a task's: maybe of a backend taking any queue
    prepared = Prepared(row.message_id, row.due_ms, row.envelope)
    record = row.record if task else None
    replace = row.mode == OutboxMessage.REPLACE
    return Outgoing(
        queue,
        prepared,
        replace=replace,
        record=record,
        priority=row.priority,
        unique_ms=row.unique_ms or 0,  # None: no window (a row of a process not upgraded)
    )


class OutboxRelay:
    """One relay: :meth:`relay_once` sends what it can claim of every database's outbox."""

    def __init__(self, *, batch: int = BATCH, databases: list[str] | None = None) -> None:
        self.batch = batch
        self.databases = databases
        self._table_missing_logged: set[str] = set()
        # A full Redis refuses every pass: said once, and once when it takes rows again.
        self.memory = OutOfMemoryLog(logger, "outbox")

    def relay_once(self) -> RelayPass:
        """One pass over every database; never raises for a database or Redis that is down."""
        done = RelayPass()
        for alias in outbox_databases() if self.databases is None else self.databases:
            try:
                claimed = self.claim(alias)
            except (DatabaseError, ImproperlyConfigured) as e:
                self._log_database_error(alias, e)
                continue
            failed_before = done.failed
            self._send(alias, claimed, done)
            # Only a batch sent whole asks for another pass at once: one that failed (Redis
            # down, say) must wait for the next interval, not spin against the outage.
            done.full = done.full or (len(claimed) == self.batch and done.failed == failed_before)
            if done.redis_down:
                break
        return done

    def relay_all(self) -> RelayPass:
        """Passes until nothing more is free or Redis is down (``runqueue --burst``)."""
        total = RelayPass()
        while True:
            total.add(self.relay_once())
            if not total.full or total.redis_down:
                return total

    def relay_rows(self, selected: QuerySet[OutboxMessage]) -> RelayPass:
        """Send the rows of ``selected`` that no one holds now (the admin's "Send now")."""
        done = RelayPass()
        alias = selected.db
        wanted = list(selected.values_list("pk", flat=True))
        for start in range(0, len(wanted), self.batch):
            claimed = self.claim(alias, wanted[start : start + self.batch])
            done.failed += len(wanted[start : start + self.batch]) - len(claimed)  # held
            self._send(alias, claimed, done)
            if done.redis_down:
                done.failed += max(0, len(wanted) - start - self.batch)
                break
        return done

    def claim(self, alias: str, among: Any = None) -> list[OutboxMessage]:
        """Lease up to ``batch`` free rows of ``alias``, oldest first, to this relay."""
        now = timezone.now()
        lease = now + timedelta(seconds=float(dq_settings.OUTBOX_LEASE_SECONDS))
        free = rows(alias).filter(Q(leased_until__isnull=True) | Q(leased_until__lte=now))
        if among is not None:
            free = free.filter(pk__in=list(among))
        features = connections[alias].features
        # Oracle has SKIP LOCKED but not with a LIMIT: the conditional UPDATEs there.
        if (
            features.has_select_for_update_skip_locked
            and features.supports_select_for_update_with_limit
        ):
            with transaction.atomic(using=alias):
                claimed = list(
                    free.select_for_update(skip_locked=True).order_by("created_at")[: self.batch]
                )
                _lease(rows(alias).filter(pk__in=[r.pk for r in claimed]), lease, now)
            return claimed
        # No row locks (SQLite): a row is ours if our conditional UPDATE changed it.
        claimed = []
        for row in free.order_by("created_at")[: self.batch]:
            if _lease(free.filter(pk=row.pk), lease, now) == 1:
                claimed.append(row)
        return claimed

    def _send(self, alias: str, claimed: list[OutboxMessage], done: RelayPass) -> None:
        for i, row in enumerate(claimed):
            try:
                result = outgoing_of(row).send_once(str(row.pk))
            except RedisUnavailable as e:
                # The rest would fail alike: all go back at once, for the next pass.
                waiting = len(claimed) - i
                if not self.memory.check(e, f"sending {waiting} row(s)"):
                    logger.warning("outbox: %d row(s) wait for Redis: %s", waiting, e)
                for left in claimed[i:]:
                    release(left, alias, e)
                done.failed += len(claimed) - i
                done.redis_down = True
                return
            except (
                DelayQueueError
            ) as e:  # this row alone: a queue not configured here, a broken key
                logger.error(
                    "outbox row %s (queue %s) not sent: %s",
                    row.pk,
                    row.queue,
                    e,
                    extra=id_fields(row.queue, row.message_id),
                )
                release(row, alias, e, wait=ROW_FAILURE_WAIT)
                done.failed += 1
                continue
            self.memory.taken()
            delete_sent(row, alias)
            if result is None:
                done.already_sent += 1
                logger.info(
                    "outbox row %s (%s) was sent already",
                    row.pk,
                    row.message_id,
                    extra=id_fields(row.queue, row.message_id),
                )
            else:
                done.sent += 1
                log_result(result, row.queue)
                logger.info(
                    "outbox: sent %s on %s (due %d ms, waited since %s)",
                    row.message_id,
                    row.queue,
                    row.due_ms,
                    row.created_at.isoformat(),
                    extra=id_fields(row.queue, row.message_id),
                )

    def _log_database_error(self, alias: str, error: Exception) -> None:
        # No table (not migrated) would otherwise log every second for ever.
        level = logging.DEBUG if alias in self._table_missing_logged else logging.WARNING
        self._table_missing_logged.add(alias)
        logger.log(level, "outbox of database %r not read: %s", alias, error)


def _lease(rows_to_lease: QuerySet[OutboxMessage], until: object, now: object) -> int:
    return rows_to_lease.update(leased_until=until, relayed_at=now)


class RelayThread:
    """Runs :class:`OutboxRelay` passes in a daemon thread until :meth:`stop`."""

    def __init__(self, relay: OutboxRelay | None = None, interval: float | None = None) -> None:
        self.relay = relay or OutboxRelay()
        self.interval = float(dq_settings.OUTBOX_RELAY_SECONDS if interval is None else interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dq-outbox-relay", daemon=True)

    def start(self) -> RelayThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.relay.relay_once()
            except Exception:  # never let the relay die quietly: log and try again
                logger.exception("outbox relay pass failed")
                done = RelayPass()
            finally:
                close_old_connections()
            if not done.full:
                self._stop.wait(self.interval)
        connections.close_all()  # this thread's own connections
