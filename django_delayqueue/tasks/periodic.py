"""``@periodic``: make a Django ``@task`` a recurring schedule, with the options of
``DELAYQUEUE["SCHEDULES"]``::

    from django.tasks import task
    from django_delayqueue.tasks.periodic import periodic

    @periodic(cron="0 3 * * *", timezone="Europe/Berlin")
    @task(queue_name="reports")
    def nightly_report() -> None: ...

The schedule is named after the task's dotted path (or ``name=``), runs on the task's queue
through its backend, and is kept by runqueue like any other: no beat process. Registered when
the module is imported; runqueue imports each installed app's ``tasks`` module before it reads
the schedules, and a settings entry of the same name wins (staff edit it in the admin).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django_delayqueue.core.recurring.recurrence import CatchUp, Recurrence

logger = logging.getLogger(__name__)

_registry: dict[str, Recurrence] = {}
_lock = threading.Lock()
_discovered_all = True  # whether the last discover() imported every tasks module


def periodic(
    *,
    cron: str | None = None,
    every: float | None = None,
    timezone: str = "UTC",
    catch_up: CatchUp = "latest",
    catch_up_limit: int = 100,
    args: list[Any] | tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    paused: bool = False,
    name: str | None = None,
    key: str | None = None,
) -> Callable[[Any], Any]:
    """Register the decorated task as a recurring schedule; returns the task unchanged.

    ``key``: every tick's flow key (without it, the backend's ``KEY_ARGUMENT`` reads it from
    ``args``/``kwargs``, as for an enqueue).

    Raises :class:`ConfigurationError` at import for options that cannot run (a bad cron
    expression, no ``cron`` or ``every``, an unknown time zone, arguments that are not JSON).
    """

    def register(task: Any) -> Any:
        path = getattr(task, "module_path", None)
        if not isinstance(path, str):
            raise TypeError("@periodic goes above @task: it takes a Task, not a function")
        recurrence = Recurrence(
            name=name or path,
            queue=task.queue_name,
            cron=cron,
            every=every,
            timezone=timezone,
            catch_up=catch_up,
            catch_up_limit=catch_up_limit,
            paused=paused,
            task=path,
            backend=task.backend,
            args=list(args),
            kwargs=dict(kwargs or {}),
            key=key,
        )
        with _lock:
            _registry[recurrence.name] = recurrence
        return task

    return register


def registered() -> dict[str, Recurrence]:
    """The schedules ``@periodic`` registered so far (import the tasks modules first)."""
    with _lock:
        return dict(_registry)


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def discover() -> dict[str, Recurrence]:
    """Import every installed app's ``tasks`` module, then return what registered."""
    global _discovered_all
    from django_delayqueue.conf.task_backends import delayqueue_backends

    # Only with a TASKS backend of this app: Django 6 has a default TASKS (the immediate
    # backend) in every project, whose tasks modules are none of our business.
    if delayqueue_backends():
        from django.utils.module_loading import autodiscover_modules

        try:
            autodiscover_modules("tasks")
            _discovered_all = True
        except Exception:  # a broken tasks module must not stop runqueue or migrate
            _discovered_all = False
            logger.exception("importing the tasks modules failed; @periodic tasks may be missing")
    return registered()


def discovered_all() -> bool:
    """False when the last :func:`discover` failed to import a tasks module: what is
    registered may then lack some ``@periodic`` tasks (so nothing is taken for deleted)."""
    return _discovered_all
