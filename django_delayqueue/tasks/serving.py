"""A worker's side of Django's Tasks: which of its queues run tasks, and the runner that runs them.

:class:`TaskServing` is a part the :class:`~django_delayqueue.worker.Worker` builds and owns
(``worker.tasks``), given what it needs of the worker in its constructor: its name, the id
task results list, and the consumer's ``write_soon`` and ``add_queues``. It owns the task state
(the task queues, the runner). Kept apart from the worker's delivery to signal receivers
because a queue's messages are tasks only by what is decided here (the envelope's task mark,
the backends' queues, the registry of task queues that a backend taking any queue fills), and
because everything it needs of the Tasks framework is imported on the first task: a worker on
a project without the framework never loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django_delayqueue.api import topic
from django_delayqueue.conf.queues import shard_queues
from django_delayqueue.conf.task_backends import any_task_queue, backend_takes, task_queue_names
from django_delayqueue.conf.task_registry import is_registered, register, registered
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, Reject
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.dispatch import is_async_receiver
from django_delayqueue.tasks.payload import TASK_KEY, is_task_payload

if TYPE_CHECKING:
    from django_delayqueue.tasks.runner import TaskRunner, WriteSoon

logger = logging.getLogger(__name__)


class TaskServing:
    """The tasks of a worker's queues: which queues run them, and their runner.

    ``name``: the worker's, for log lines; ``worker_id``: what each task's result lists in its
    worker_ids; ``write_soon`` and ``add_queues``: the consumer's (a task's RUNNING write with
    the next round trip; serving a task queue found in the registry). ``discover``: serve each
    queue tasks are sent to, found in the registry (with a backend that takes any queue).
    """

    def __init__(
        self,
        name: str,
        worker_id: str,
        write_soon: WriteSoon,
        add_queues: Callable[[Sequence[Queue]], list[Queue]],
        *,
        discover: bool = False,
    ) -> None:
        self.name = name
        self.worker_id = worker_id
        self._write_soon = write_soon
        self._add_queues = add_queues
        # Read by handler threads, replaced (never changed in place) by the loop's.
        self._task_queues = frozenset(task_queue_names())
        self.any_queue = any_task_queue()  # a TASKS backend takes any queue
        self._discover = discover and self.any_queue
        self._runner: TaskRunner | None = None  # once the first task came
        self._async_tasks: dict[str, bool] = {}  # task path -> whether it is async def

    def runs_tasks(self, queues: Sequence[Queue]) -> bool:
        """Whether any of ``queues`` may carry tasks (then the worker prepares for them)."""
        return self.any_queue or bool(self._task_queues & {q.logical_name for q in queues})

    def prepare(self, queues: Sequence[Queue]) -> None:
        """Pay before the first task what it would pay late: importing the framework, its
        backends and the ``tasks`` modules of the installed apps (as Celery and huey do), and
        loading the script that writes results on the task queues among ``queues``. Nothing
        here stops the worker: a module that fails to import is logged, and its tasks fail
        (and retry) as they would have."""
        try:
            self.runner()
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
        self._load_scripts(queues)

    def _load_scripts(self, queues: Sequence[Queue]) -> None:
        """Load the script that writes results on the task queues among ``queues``."""
        runner = self._runner
        for q in queues:
            if runner is not None and (self.any_queue or q.logical_name in self._task_queues):
                try:
                    runner.load_scripts(q)
                except DelayQueueError as e:
                    logger.debug("scripts not loaded ahead on %s: %s", q.name, e)

    def runner(self) -> TaskRunner:
        """The runner of Django tasks (imported on the first task: it needs the framework)."""
        runner = self._runner
        if runner is None:
            try:
                from django_delayqueue.tasks.runner import TaskRunner
            except ImportError as e:
                raise Reject(f"a task message, but no Tasks framework here: {e}") from e
            runner = self._runner = TaskRunner(self.worker_id, self._write_soon)
        return runner

    def retry_buried(self, queue: Queue, message: Message, reason: str) -> None:
        """A task's delivery that failed with attempts left, buried by its nack as aborted
        (``reason``: the dead letter's), its record FAILED now: ``task_finished`` is sent, as
        for any task that ended. Its run made the runner: without one (no framework), no
        task ran here."""
        runner = self._runner
        if runner is not None:
            runner.retry_buried(message, queue, reason)

    def is_async(self, message: Message) -> bool:
        """Whether the task in ``message`` is an ``async def`` one (asked once per task)."""
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

    def is_task(self, message: Message) -> bool:
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
        if not self.any_queue or not is_registered(name):  # Redis down: raises, retried
            return False
        self._task_queues = self._task_queues | {name}
        return True

    def follow_registry(self, served: Sequence[Queue]) -> None:
        """With a backend that takes any queue: take the registry's queues as task queues, and
        serve the new ones (``discover``; ``served``: the worker's queues now)."""
        if not self.any_queue:
            return
        try:
            names = registered()
        except DelayQueueError as e:
            logger.debug("task queues not read from the registry: %s", e)
            return
        self._task_queues = self._task_queues | set(names)
        if not self._discover:
            return
        logical = {q.logical_name for q in served}
        for name in [n for n in names if n not in logical]:
            try:
                shards = shard_queues(name)
            except ConfigurationError as e:  # its DELAYQUEUE settings became invalid
                logger.warning("task queue %s not served: %s", name, e)
                continue
            self._load_scripts(self._add_queues(shards))
            logger.info("%s now consuming %s (tasks were sent there)", self.name, name)

    def register_schedules(self, found: Sequence[Recurrence]) -> None:
        """With a backend that takes any queue: a ``task`` schedule on a queue only such a
        backend takes makes that queue run tasks, and goes into the registry so that
        get_result and runqueue find it."""
        if not self.any_queue:
            return
        for r in found:
            if r.task and r.queue not in self._task_queues and backend_takes(r.backend, r.queue):
                try:
                    register(r.queue)
                except DelayQueueError as e:
                    logger.debug("task queue %s not registered: %s", r.queue, e)
                    continue
                self._task_queues = self._task_queues | {r.queue}
