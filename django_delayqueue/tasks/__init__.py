"""Django's Tasks framework (``django.tasks``, or the ``django-tasks`` backport) on delay queues.

    TASKS = {"default": {"BACKEND": "django_delayqueue.tasks.DelayQueueBackend"}}

The backend loads on first use, so that ``runqueue`` and the admin import this package's
Django-free parts (``payload``) on a project without the framework. :func:`flow_key` gives the
tasks enqueued inside its block a flow key (``tasks.flow_keys``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_delayqueue.tasks.flow_keys import flow_key

if TYPE_CHECKING:
    from django_delayqueue.core.consumer.handlers.progress_reports import progress
    from django_delayqueue.tasks.backend import DelayQueueBackend
    from django_delayqueue.tasks.progress_reading import progress_of

__all__ = ["DelayQueueBackend", "flow_key", "progress", "progress_of"]


def __getattr__(name: str) -> Any:
    if name == "progress":
        # The running task's progress (a TaskContext is a frozen dataclass without room for a
        # method of ours): the same as dq.progress, Django-free.
        from django_delayqueue.core.consumer.handlers.progress_reports import progress

        return progress
    if name == "progress_of":
        from django_delayqueue.tasks.progress_reading import progress_of

        return progress_of
    if name == "DelayQueueBackend":
        from django_delayqueue.tasks.backend import DelayQueueBackend

        return DelayQueueBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
