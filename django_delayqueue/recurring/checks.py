"""System checks of ``DELAYQUEUE["SCHEDULES"]`` (registered by ``django_delayqueue.checks``).

delayqueue.E009: a schedule that cannot run: invalid options, or a queue no runqueue serves.
delayqueue.W005: the same of a schedule row (added in the admin), with the database checks.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning
from django.db import DatabaseError

from django_delayqueue.conf.settings import queue_names
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.recurring.definitions import declared

HINT = 'See "Recurring schedules" in the docs (docs/recurring.md).'


def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    try:
        schedules = declared(discover_tasks=False)
    except ConfigurationError as e:
        return [Error(f"{e}.", hint=HINT, id="delayqueue.E009")]
    out = []
    queues = set(queue_names())
    for name, options in schedules.items():
        try:
            recurrence = Recurrence.from_mapping(str(name), options)
        except ConfigurationError as e:
            out.append(Error(f'DELAYQUEUE["SCHEDULES"]: {e}.', hint=HINT, id="delayqueue.E009"))
            continue
        if recurrence.queue not in queues:
            out.append(
                Error(
                    f'DELAYQUEUE["SCHEDULES"][{name!r}]: queue {recurrence.queue!r} is not '
                    "configured, so no runqueue would keep this schedule.",
                    hint="Add the queue to DELAYQUEUE['QUEUES'] (or a TASKS backend's QUEUES).",
                    id="delayqueue.E009",
                )
            )
    return out


def check_schedule_rows(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """W005: schedule rows that no runqueue will keep (only with ``check --database``)."""
    if not databases:
        return []
    from django_delayqueue.models import RecurringSchedule

    queues = set(queue_names())
    out = []
    try:
        rows = list(RecurringSchedule.objects.all())
    except DatabaseError:  # not migrated yet
        return []
    for row in rows:
        try:
            recurrence = Recurrence.from_mapping(row.name, row.definition())
        except ConfigurationError as e:
            out.append(Warning(f"recurring schedule row: {e}.", hint=HINT, id="delayqueue.W005"))
            continue
        if recurrence.queue not in queues:
            out.append(
                Warning(
                    f"recurring schedule {row.name!r}: queue {recurrence.queue!r} is not "
                    "configured, so no runqueue keeps it.",
                    hint="Configure the queue, or edit or delete the schedule in the admin.",
                    id="delayqueue.W005",
                )
            )
    return out
