"""System checks of ``DELAYQUEUE["SCHEDULES"]`` (registered by ``django_delayqueue.checks``).

delayqueue.E009: a schedule that cannot run: invalid options, or a queue no runqueue serves.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error

from django_delayqueue.conf.settings import queue_names
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.recurring.definitions import declared

HINT = 'See "Recurring schedules" in the docs (docs/recurring.md).'


def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    try:
        schedules = declared()
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
