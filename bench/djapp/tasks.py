"""The benchmark's task: a no-op that notes when it ran (``timing.record``)."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 4.2-5.2: the django-tasks backport
    from django_tasks import task

from .settings import TASK_QUEUE
from .timing import record


@task(queue_name=TASK_QUEUE)
def noop(index: int, due_ms: float, last: int) -> None:
    record(index, due_ms, last)
