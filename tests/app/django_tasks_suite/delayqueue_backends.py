"""DelayQueueBackend where Django's tests/tasks use Django's reference backends.

The vendored tests name these in their ``TASKS`` overrides instead of Django's dummy and
immediate backends (the one edit made to them, see README.md). Each is DelayQueueBackend,
unchanged, plus only what the role needs in a test:

- ``DelayQueueDummy``: enqueued tasks stay READY, nobody runs them (no worker runs here),
  as with the dummy backend. ``results`` and ``clear()`` are what the dummy backend's tests
  look at: the results this backend has sent (``task_enqueued``), and forgetting them
  (their messages cancelled, their records deleted).
- ``DelayQueueImmediate``: the task runs before ``enqueue`` returns, as with the immediate
  backend: ``runqueue --burst`` of the task's queue (a real ``Worker``, in this process),
  then the result as ``get_result`` reads it.
"""

from __future__ import annotations

import threading
from typing import Any

from django.tasks.signals import task_enqueued

from django_delayqueue.conf.connection import get_client
from django_delayqueue.conf.queues import get_queue
from django_delayqueue.tasks.backend import DelayQueueBackend
from django_delayqueue.worker import Worker

_lock = threading.Lock()
_sent: list[Any] = []  # TaskResults of DelayQueueDummy backends, as task_enqueued sent them


def _remember(sender: Any, task_result: Any, **kwargs: Any) -> None:
    if issubclass(sender, DelayQueueDummy):
        with _lock:
            _sent.append(task_result)


task_enqueued.connect(_remember, weak=False, dispatch_uid="delayqueue_backends._remember")


class DelayQueueDummy(DelayQueueBackend):
    """DelayQueueBackend in the dummy backend's place: tasks are enqueued, none runs."""

    @property
    def results(self) -> list[Any]:
        with _lock:
            return [r for r in _sent if r.backend == self.alias]

    def clear(self) -> None:
        with _lock:
            mine = [r for r in _sent if r.backend == self.alias]
            _sent[:] = [r for r in _sent if r.backend != self.alias]
        for result in mine:
            queue = get_queue(result.task.queue_name, task=True)
            queue.cancel(result.id)
            get_client().delete(queue.keys_for(result.id).task_result(result.id))


class DelayQueueImmediate(DelayQueueBackend):
    """DelayQueueBackend in the immediate backend's place: runqueue --burst runs the task."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        Worker.for_queues([task.queue_name], burst=True, name="tasks-suite").run()
        result.refresh()
        return result
