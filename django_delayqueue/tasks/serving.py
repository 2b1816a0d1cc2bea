"""A worker's side of Django's Tasks: which of its queues run tasks, and the runner that runs them.

A mixin of :class:`~django_delayqueue.worker.Worker`, which sets the state declared below in its
``__init__`` and provides the Consumer's ``write_soon`` and ``add_queues``. Kept apart from the
worker's delivery to signal receivers because a queue's messages are tasks only by what is
decided here (the envelope's task mark, the backends' queues, the registry of task queues that a
backend taking any queue fills), and because everything it needs of the Tasks framework is
imported on the first task: a worker on a project without the framework never loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.api import topic
from django_delayqueue.conf.queues import shard_queues
from django_delayqueue.conf.task_backends import backend_takes
from django_delayqueue.conf.task_registry import is_registered, register, registered
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, Reject
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.dispatch import is_async_receiver
from django_delayqueue.tasks.payload import TASK_KEY, is_task_payload

if TYPE_CHECKING:
    from django_delayqueue.core.consumer.outcomes import WhileRunning
    from django_delayqueue.core.scripts.calls import ScriptCall

logger = logging.getLogger(__name__)


class TaskServing:
    name: str
    worker_id: str  # what each task's result lists in its worker_ids
    queues: list[Queue]
    _by_name: dict[str, Queue]  # the worker's queues (shards) by name
    # Read by handler threads, replaced (never changed in place) by the loop's.
    _task_queues: frozenset[str]
    _any_queue: bool  # a TASKS backend takes any queue
    _discover: bool  # serve each queue tasks are sent to, found in the registry
    _tasks: Any  # the TaskRunner, once the first task came
    _async_tasks: dict[str, bool]  # task path -> whether it is async def

    if TYPE_CHECKING:  # the Consumer's

        def write_soon(self, queue: Queue, call: ScriptCall | WhileRunning) -> None: ...

        def add_queues(self, queues: Sequence[Queue]) -> list[Queue]: ...

    def _prepare_for_tasks(self) -> None:
        """Pay before the first task what it would pay late: importing the framework, its
        backends and the ``tasks`` modules of the installed apps (as Celery and huey do), and
        loading the script that writes results. Nothing here stops the worker: a module that
        fails to import is logged, and its tasks fail (and retry) as they would have."""
        try:
            self._task_runner()
        except Reject as e:
            logger.warning("%s", e)
            return
        from django.utils.module_loading import autodiscover_modules

        from django_delayqueue.tasks import framework

        try:
            autodiscover_modules("tasks")
            framework.task_backends.all()
        except Exception:
            logger.exception(
                "%s: preparing for tasks failed; they will import as they run", self.name
            )
        self._load_task_scripts(self.queues)

    def _load_task_scripts(self, queues: Sequence[Queue]) -> None:
        """Load the script that writes results on the task queues among ``queues``."""
        runner = self._tasks
        for q in queues:
            if runner is not None and (self._any_queue or q.logical_name in self._task_queues):
                try:
                    runner.load_scripts(q)
                except DelayQueueError as e:
                    logger.debug("scripts not loaded ahead on %s: %s", q.name, e)

    def _task_runner(self) -> Any:
        """The runner of Django tasks (imported on the first task: it needs the framework)."""
        if self._tasks is None:
            try:
                from django_delayqueue.tasks.runner import TaskRunner
            except ImportError as e:
                raise Reject(f"a task message, but no Tasks framework here: {e}") from e
            self._tasks = TaskRunner(self.worker_id, self.write_soon)
        return self._tasks

    def _task_is_async(self, message: Message) -> bool:
        path = message.payload.get(TASK_KEY) if isinstance(message.payload, dict) else None
        if not isinstance(path, str):
            return False
        known = self._async_tasks.get(path)
        if known is None:
            try:
                from django_delayqueue.tasks.results import load_task

                known = is_async_receiver(load_task(path).func)
            except Exception:  # fails on a handler thread, as it always did
                known = False
            self._async_tasks[path] = known
        return known

    def _is_task(self, message: Message) -> bool:
        """Whether ``message`` is a task to run: its envelope carries the task mark, which only
        the Tasks backend's enqueue (and a recurring ``task`` schedule) sets, never a payload.
        A signal message whose payload has a "django.task" key (a webhook's JSON, say) goes to
        its receivers: it must never import and run anything.

        A task enqueued by an earlier version has no mark: it is still run where that version
        ran it (a queue a TASKS backend takes) if no signal receiver listens there, so the
        messages waiting across an upgrade keep working and a signal queue never runs one.
        """
        if message.task:
            return True
        return (
            is_task_payload(message.payload)
            and self._is_task_queue(message.queue)
            and not topic(message.queue).has_listeners(sender=message.queue)
        )

    def _is_task_queue(self, name: str) -> bool:
        """A queue a TASKS backend lists, or, with one that takes any queue, one in the
        registry of task queues (asked at once for a queue registered since the last
        refresh). Never a queue only signal messages go to: a payload shaped like a task
        there (a webhook's JSON) must not import and run anything."""
        if name in self._task_queues:
            return True
        if not self._any_queue or not is_registered(name):  # Redis down: raises, retried
            return False
        self._task_queues = self._task_queues | {name}
        return True

    def _follow_registry(self) -> None:
        """Take the registry's queues as task queues, and serve the new ones (``discover``)."""
        try:
            names = registered()
        except DelayQueueError as e:
            logger.debug("task queues not read from the registry: %s", e)
            return
        self._task_queues = self._task_queues | set(names)
        if not self._discover:
            return
        served = {q.logical_name for q in self.queues}
        for name in [n for n in names if n not in served]:
            try:
                shards = shard_queues(name)
            except ConfigurationError as e:  # its DELAYQUEUE settings became invalid
                logger.warning("task queue %s not served: %s", name, e)
                continue
            added = self.add_queues(shards)
            self._by_name.update((q.name, q) for q in added)
            self._load_task_scripts(added)
            logger.info("%s now consuming %s (tasks were sent there)", self.name, name)

    def _register_task_schedules(self, found: Sequence[Recurrence]) -> None:
        """A ``task`` schedule on a queue only a backend taking any queue takes: that queue
        runs tasks, and goes into the registry so that get_result and runqueue find it."""
        for r in found:
            if r.task and r.queue not in self._task_queues and backend_takes(r.backend, r.queue):
                try:
                    register(r.queue)
                except DelayQueueError as e:
                    logger.debug("task queue %s not registered: %s", r.queue, e)
                    continue
                self._task_queues = self._task_queues | {r.queue}
