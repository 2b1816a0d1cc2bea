"""System checks of ``DELAYQUEUE["SCHEDULES"]`` (registered by ``django_delayqueue.checks``).

delayqueue.E009: a schedule that cannot run: invalid options, a queue no runqueue serves, a
``task`` on a queue no TASKS backend of this app takes (its ticks would go to the queue's
signal handlers, and never run the task), or a ``payload`` on a task queue without a signal
handler (every tick would be dead-lettered: "no handler"), or a ``key`` whose messages live on
another shard of a sharded queue than the schedule's ticks.
delayqueue.W005: the same of a schedule row (added in the admin), with the database checks.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning
from django.db import DatabaseError

from django_delayqueue.api import topics
from django_delayqueue.conf.settings import queue_names, queue_shards
from django_delayqueue.conf.task_backends import backend_takes, task_queue_names
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.core.sharding import keyed_schedule_problem
from django_delayqueue.mirror.recurrences import declared

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
        problem = _kept_problem(
            recurrence,
            queues,
            "so no runqueue would keep this schedule.",
            "Add the queue to DELAYQUEUE['QUEUES'] (or a TASKS backend's QUEUES).",
        )
        if problem is not None:
            what, hint = problem
            out.append(
                Error(f'DELAYQUEUE["SCHEDULES"][{name!r}]: {what}', hint=hint, id="delayqueue.E009")
            )
    return out


def _kept_problem(
    recurrence: Recurrence, queues: set[str], unkept: str, unkept_hint: str
) -> tuple[str, str] | None:
    """What keeps a valid schedule from running as declared (E009, W005), with a hint: a
    queue no runqueue serves, or a task where no backend runs it (or a payload where only
    tasks run)."""
    if recurrence.queue not in queues and not _takes_its_task(recurrence):
        return f"queue {recurrence.queue!r} is not configured, {unkept}", unkept_hint
    return key_problem(recurrence) or task_problem(recurrence)


def key_problem(recurrence: Recurrence) -> tuple[str, str] | None:
    """A keyed schedule on a sharded queue whose key's shard is not its name's."""
    try:
        shards = queue_shards(recurrence.queue)
    except ConfigurationError:  # reported by the queue checks
        return None
    problem = keyed_schedule_problem(recurrence.name, recurrence.key, shards)
    if problem is None:
        return None
    return (
        f"its key {recurrence.key!r} cannot be kept: {problem}.",
        'See "Keys" in docs/flow-control.md.',
    )


def _takes_its_task(recurrence: Recurrence) -> bool:
    """A ``task`` schedule whose backend takes any queue: its queue needs no configuring."""
    return bool(recurrence.task) and backend_takes(recurrence.backend, recurrence.queue)


def task_problem(recurrence: Recurrence) -> tuple[str, str] | None:
    """Why the ticks of ``recurrence`` would never do what it says (what, and what to change):
    a ``task`` on a queue its backend does not take, a ``payload`` on a task queue that no
    signal handler takes. None when they would."""
    queue, alias = recurrence.queue, recurrence.backend
    if recurrence.task:
        if backend_takes(alias, queue):
            return None
        return (
            f"task {recurrence.task!r} on queue {queue!r}, which TASKS[{alias!r}] does not "
            "list (or is no DelayQueueBackend), so runqueue would send each tick to the "
            "queue's signal handlers and never run the task.",
            f"Add {queue!r} to TASKS[{alias!r}]['QUEUES'], or give the schedule a queue that "
            'backend lists (and "backend": the TASKS alias, if not "default").',
        )
    signal = topics().get(queue)
    if queue in task_queue_names() and (signal is None or not signal.has_listeners()):
        return (
            f"a payload on queue {queue!r}, a queue of a TASKS backend that no signal handler "
            "takes, so every tick would be dead-lettered ('no handler').",
            f'Give the schedule "task" (the dotted path of a @task) instead of "payload", '
            f"or a signal queue, or connect a handler with @receiver(dq.topic({queue!r})).",
        )
    return None


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
        problem = _kept_problem(
            recurrence,
            queues,
            "so no runqueue keeps it.",
            "Configure the queue, or edit or delete the schedule in the admin.",
        )
        if problem is not None:
            what, hint = problem
            out.append(
                Warning(f"recurring schedule {row.name!r}: {what}", hint=hint, id="delayqueue.W005")
            )
    return out
