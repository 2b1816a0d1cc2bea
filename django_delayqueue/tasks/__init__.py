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
    from django_delayqueue.tasks.backend import DelayQueueBackend

__all__ = ["DelayQueueBackend", "flow_key"]


def __getattr__(name: str) -> Any:
    if name == "DelayQueueBackend":
        from django_delayqueue.tasks.backend import DelayQueueBackend

        return DelayQueueBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
