"""How many outbox rows wait, and for how long: for the admin, the health probe and the check."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Count, Max, Min
from django.utils import timezone

from django_delayqueue.outbox.committing import rows

logger = logging.getLogger("django_delayqueue.outbox")


@dataclass(frozen=True)
class Backlog:
    """The unsent rows of one database's outbox."""

    database: str
    count: int
    oldest: datetime | None  # when the oldest waiting row was committed
    last_relayed: datetime | None  # when a relay last tried any of them
    last_error: str  # the newest row's error, if any

    def age_seconds(self, now: datetime | None = None) -> float:
        """How long the oldest row has waited (0 when none waits)."""
        if self.oldest is None:
            return 0.0
        return max(0.0, ((now or timezone.now()) - self.oldest).total_seconds())


def outbox_backlog(databases: list[str] | None = None) -> list[Backlog]:
    """The backlog of every database the outbox may live in; one without the table is left out
    (not migrated: nothing can wait in it), and so is one that cannot be read (see
    :func:`read_backlogs` for those)."""
    return read_backlogs(databases)[0]


def read_backlogs(databases: list[str] | None = None) -> tuple[list[Backlog], dict[str, str]]:
    """The backlogs, and the databases that hold the outbox table (or might) but could not be
    read, each with its error: the health probe fails for those, since a database down must
    not look like one with nothing waiting."""
    from django_delayqueue.outbox.relay import outbox_databases

    found = []
    unreadable: dict[str, str] = {}
    for alias in outbox_databases() if databases is None else databases:
        try:
            # In a savepoint: a failed read (no table) must not abort a transaction the caller
            # has open on this database (ATOMIC_REQUESTS, say).
            with transaction.atomic(using=alias):
                summary, newest_error = _read(alias)
        except DatabaseError as e:
            logger.debug("outbox backlog of %r not read: %s", alias, e)
            if not _without_table(alias):
                unreadable[alias] = f"{type(e).__name__}: {e}"
            continue
        found.append(
            Backlog(
                alias,
                summary["count"],
                summary["oldest"],
                summary["last_relayed"],
                newest_error or "",
            )
        )
    return found, unreadable


def _without_table(alias: str) -> bool:
    """Whether the database answers and has no outbox table (False when it does not answer:
    whether it has one is then unknown)."""
    from django_delayqueue.models import OutboxMessage

    connection = connections[alias]
    if connection.connection is None:
        # The read failed connecting: asking would connect a second time in the same pass (to
        # a database dropping connections, a second wait for its timeout), and not answer.
        return False
    try:
        with connection.cursor() as cursor:
            names = connection.introspection.table_names(cursor)
    except DatabaseError:
        return False
    return OutboxMessage._meta.db_table not in names


def _read(alias: str) -> tuple[dict[str, Any], str | None]:
    """The backlog's figures, and the error of the newest row that has one."""
    summary = rows(alias).aggregate(
        count=Count("pk"), oldest=Min("created_at"), last_relayed=Max("relayed_at")
    )
    newest_error = (
        rows(alias)
        .exclude(last_error="")
        .order_by("-created_at")
        .values_list("last_error", flat=True)
        .first()
    )
    return summary, newest_error
