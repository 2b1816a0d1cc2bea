"""Which ``settings.TASKS`` backends are this app's, and which queues they take.

A backend is this app's when its ``BACKEND`` is ``DelayQueueBackend`` or a subclass of it, at
whatever import path (a project's own subclass): recognised by class, not by the path string.
Only a path that is not this app's spelling is imported to tell, and never one of the
framework's own backends (which cannot subclass ours), so that a project on Django 6's
default ``TASKS`` imports nothing here.

``"QUEUES": []`` means what Django documents: any queue name is valid. Such a backend's tasks
go to whatever queue they name; that queue gets its ``DELAYQUEUE["QUEUES"]`` settings if it is
there, else the ``DEFAULTS``, and ``runqueue`` finds it in the registry of queues enqueued to
(``conf.task_registry``).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from django.conf import settings as django_settings

# The backend as settings.TASKS may name it (the package re-exports the class).
TASKS_BACKENDS = (
    "django_delayqueue.tasks.DelayQueueBackend",
    "django_delayqueue.tasks.backend.DelayQueueBackend",
)
DEFAULT_TASK_QUEUE = "default"  # Django's default QUEUES for a backend, and queue_name of a task
# Backends of the framework itself: never a subclass of ours, never imported to tell.
_FRAMEWORK_PACKAGES = ("django.tasks.", "django_tasks.")


def is_delayqueue_backend(path: object) -> bool:
    """Whether a ``TASKS`` entry's ``BACKEND`` is DelayQueueBackend or a subclass of it."""
    if not isinstance(path, str):
        return False
    if path in TASKS_BACKENDS:
        return True
    if path.startswith(_FRAMEWORK_PACKAGES):
        return False
    return _subclasses_ours(path)


@lru_cache(maxsize=64)
def _subclasses_ours(path: str) -> bool:
    from django.utils.module_loading import import_string

    try:
        backend = import_string(path)
    except Exception:  # not importable: the framework's own check reports it
        return False
    ours = TASKS_BACKENDS[1]
    return isinstance(backend, type) and any(
        f"{cls.__module__}.{cls.__qualname__}" == ours for cls in backend.__mro__
    )


def delayqueue_backends() -> dict[str, dict[str, Any]]:
    """The ``TASKS`` entries (alias -> params) of this app's backends."""
    tasks = getattr(django_settings, "TASKS", None) or {}
    if not isinstance(tasks, dict):
        return {}
    return {
        str(alias): params
        for alias, params in tasks.items()
        if isinstance(params, dict) and is_delayqueue_backend(params.get("BACKEND"))
    }


def backend_queues(params: dict[str, Any]) -> list[str]:
    """The queues a backend lists (Django's default: ``["default"]``); [] takes any queue."""
    queues = params.get("QUEUES", [DEFAULT_TASK_QUEUE])
    if isinstance(queues, (str, bytes)) or not isinstance(queues, Iterable):
        return []  # not a list: the framework refuses it when it builds the backend
    return [str(name) for name in queues]


def takes_any_queue(params: dict[str, Any]) -> bool:
    """``"QUEUES": []``: Django's "any queue name is valid"."""
    return "QUEUES" in params and not backend_queues(params)


def task_queue_names() -> list[str]:
    """The queues every backend of this app lists (read from the settings)."""
    names: list[str] = []
    for params in delayqueue_backends().values():
        names += backend_queues(params)
    return list(dict.fromkeys(names))


def any_task_queue() -> bool:
    """Whether a backend of this app takes any queue name (``"QUEUES": []``)."""
    return any(takes_any_queue(params) for params in delayqueue_backends().values())


def backend_takes(alias: str, queue: str) -> bool:
    """Whether ``TASKS[alias]`` is a backend of this app that takes ``queue``."""
    params = delayqueue_backends().get(alias)
    return params is not None and (takes_any_queue(params) or queue in backend_queues(params))
