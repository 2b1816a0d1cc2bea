"""A task's progress, read beside its ``TaskResult``.

Django's ``TaskResult`` (6.0, 6.1, and the ``django-tasks`` backport) is a frozen, slotted
dataclass with a fixed set of fields and no metadata: a backend can add nothing to it without
breaking the API. So the progress a running task reported (``django_delayqueue.tasks.progress``
inside it) is read here, from the result, through its backend's ``get_progress``.
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.progress import Progress
from django_delayqueue.tasks import framework


def progress_of(result: Any) -> Progress | None:
    """The progress the task of ``result`` (a ``TaskResult``) reported while it runs; None if
    it reported none, does not run now, or its backend is not a delay queue's."""
    backend = framework.task_backends[result.backend]
    get_progress = getattr(backend, "get_progress", None)
    return None if get_progress is None else get_progress(result.id)
