"""``DelayQueueBackend``: Django's Tasks framework on the delay queues.

    TASKS = {
        "default": {
            "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
            "QUEUES": ["default", "emails"],  # delay queues (their DELAYQUEUE settings apply)
            "OPTIONS": {"ON_COMMIT": True, "RESULT_TTL": 7 * 24 * 3600},
        }
    }

With ``"KEY_ARGUMENT"`` in ``OPTIONS`` (an argument's name, or a dict of task paths to names)
a task's message gets its flow key from that argument (``tasks.flow_keys``).

A task is a message of its queue (``payload.task_payload``) with a result record beside it, both
written by one script; ``runqueue`` runs it (``runner.TaskRunner``), with the queue's retries,
backoff and dead letters. ``run_after`` becomes the due time exactly as ``dq.schedule(at=...)``
does (rounded up to the millisecond, never early); a ``timedelta`` counts from now.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.conf.settings import queue_names
from django_delayqueue.core.envelope import encode_payload, new_id
from django_delayqueue.core.errors import ConfigurationError, PayloadError
from django_delayqueue.core.keys import validate_name
from django_delayqueue.core.progress import Progress
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.sharding import ShardedQueue
from django_delayqueue.observability import tracing
from django_delayqueue.outbox.committing import send_on_commit
from django_delayqueue.outbox.outgoing import Outgoing
from django_delayqueue.tasks import framework
from django_delayqueue.tasks.flow_keys import KEY_ARGUMENT, key_argument_problem, task_key
from django_delayqueue.tasks.payload import TaskRecord, task_payload
from django_delayqueue.tasks.reading import (
    find_in_outbox,
    find_record,
    reconcile,
    registered_queues,
)
from django_delayqueue.tasks.results import to_task_result

logger = logging.getLogger(__name__)

DEFAULT_RESULT_TTL = 7 * 24 * 3600  # seconds a finished task's result is kept


class DelayQueueBackend(framework.BaseTaskBackend):
    """Runs tasks through django-delayqueue: precise ``run_after``, retries, results in Redis."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True  # among tasks that are ready: see QueueKeys.ranked

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(params.get("OPTIONS") or {})
        self.options = options
        on_commit = options.get("ON_COMMIT", params.get("ENQUEUE_ON_COMMIT", True))
        self.on_commit = bool(on_commit)
        self.result_ttl = _seconds(options.get("RESULT_TTL", DEFAULT_RESULT_TTL))

    # --- enqueueing ------------------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        """The framework's checks, a ``timedelta`` run_after, and a queue name Redis can hold.

        With ``"QUEUES": []`` any queue name is valid, as Django documents: a queue
        ``DELAYQUEUE`` does not configure gets the ``DEFAULTS``.
        """
        if isinstance(task.run_after, timedelta):
            # The framework wants an aware datetime; a delay is converted at enqueue.
            super().validate_task(dataclasses.replace(task, run_after=None))
        else:
            super().validate_task(task)
        if self.queues and task.queue_name not in queue_names():
            raise framework.InvalidTask(
                f"Queue {task.queue_name!r} is not a delay queue: add it to "
                "DELAYQUEUE['QUEUES'] or to this backend's QUEUES."
            )
        try:
            validate_name(task.queue_name, "queue name")
        except ConfigurationError as e:
            raise framework.InvalidTask(f"{e}.") from e

    def enqueue(self, task: Any, args: Iterable[Any], kwargs: dict[str, Any]) -> Any:
        self.validate_task(task)
        # A producer span, as dq.schedule's: the task's message carries its trace context.
        with tracing.producing(task.queue_name) as span:
            return self._enqueue(task, args, kwargs, span)

    def _enqueue(self, task: Any, args: Iterable[Any], kwargs: dict[str, Any], span: Any) -> Any:
        queue = get_queue(task.queue_name, task=not self.queues)
        args, kwargs = _json_arguments(task, args, kwargs)
        key = task_key(task, args, kwargs, self.options.get(KEY_ARGUMENT))
        if key is not None and task.priority != 0:
            # Keyed ready messages take turns by key, prioritised ones by priority: a message
            # cannot be in both orders (refused now, not after the commit).
            raise framework.InvalidTask(
                f"task {task.module_path} has priority {task.priority} and flow key {key!r}: "
                "a keyed task takes turns by key and cannot have a priority (use priority 0, "
                "or enqueue it inside flow_key(None))"
            )
        # On a sharded queue a keyed message lives on its key's shard: its id (the result's)
        # must route there too, or the result could not be found by id.
        if key is not None and isinstance(queue, ShardedQueue):
            result_id = queue.id_for_key(key)
        else:
            result_id = new_id()
        deferred = task.run_after is not None
        payload = task_payload(
            task.module_path, args, kwargs, self.alias, priority=task.priority, deferred=deferred
        )
        now = queue.clock.now_ms()
        if isinstance(task.run_after, timedelta):
            prepared = queue.prepare(
                payload, delay=task.run_after, id=result_id, now_ms=now, task=True, key=key
            )
        elif isinstance(task.run_after, datetime):
            run_after = task.run_after
            if timezone.is_naive(run_after):  # USE_TZ = False: the framework allows it
                run_after = timezone.make_aware(run_after)
            prepared = queue.prepare(
                payload, at=run_after, id=result_id, now_ms=now, task=True, key=key
            )
        else:
            prepared = queue.prepare(payload, id=result_id, now_ms=now, task=True, key=key)
        tracing.scheduled(span, result_id, prepared.due_ms)
        if span.is_recording():
            span.set_attribute("delayqueue.task", task.module_path)
        record = TaskRecord(
            task=task.module_path,
            queue=queue.name,
            priority=int(task.priority),
            backend=self.alias,
            args=args,
            kwargs=kwargs,
            run_after=prepared.due_ms if task.run_after is not None else None,
            enqueued_at=now,
        )
        result = to_task_result(record, result_id, task)

        def enqueued() -> None:
            framework.task_enqueued.send(type(self), task_result=result)

        outgoing = Outgoing(
            queue, prepared, record=record.enqueued_json(), priority=record.priority
        )
        send_on_commit(outgoing, on_commit=self._on_commit_for(task), then=enqueued)
        return result

    def _on_commit_for(self, task: Any) -> bool:
        per_task = getattr(task, "enqueue_on_commit", None)  # the backport's Task has one
        return self.on_commit if per_task is None else bool(per_task)

    # --- results ---------------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        found = self.find_record(result_id)
        if found is None:
            listed = self._queue_names() if self.queues else None
            waiting = find_in_outbox(result_id, listed) if isinstance(result_id, str) else None
            if waiting is None:
                raise framework.TaskResultDoesNotExist(result_id)
            return to_task_result(waiting, result_id)
        queue, record = found
        reconcile(queue, result_id, record)
        return to_task_result(record, result_id)

    def get_progress(self, result_id: str) -> Progress | None:
        """The progress the task ``result_id`` reported while it runs (``dq.progress``,
        ``django_delayqueue.tasks.progress``); None when it reported none, or does not run
        now (not started, finished: progress ends with its attempt). One Redis round trip
        more than the record's. The framework's TaskResult has no field for it (a frozen,
        slotted dataclass), so it is read here, beside ``get_result``."""
        found = self.find_record(result_id)
        if found is None:
            return None
        queue = found[0]
        return queue.progress_of(result_id).get(result_id)

    def find_record(self, result_id: str) -> tuple[Queue, TaskRecord] | None:
        """The queue and record of ``result_id`` among this backend's queues (None: nowhere)."""
        found = find_record(result_id, self._queue_names())
        if found is None and not self.queues:  # sent to a queue only the registry knows?
            found = find_record(result_id, registered_queues())
        return found

    def _queue_names(self) -> list[str]:
        """The configured queues this backend sends to (all of them, if it takes any)."""
        known = queue_names()
        return [name for name in self.queues if name in known] if self.queues else known

    # --- checks ----------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> Iterable[Any]:
        from django.apps import apps
        from django.core.checks import Error

        yield from super().check(**kwargs) or []
        if not apps.is_installed("django_delayqueue"):
            yield Error(
                f"TASKS[{self.alias!r}] uses {type(self).__name__}, but 'django_delayqueue' is "
                "not in INSTALLED_APPS.",
                hint="Add 'django_delayqueue' to INSTALLED_APPS: runqueue, the outbox table "
                "the backend writes to in a transaction, and the admin of queues and results "
                "come with it.",
                id="delayqueue.E012",
            )
        if self.result_ttl <= 0:
            yield Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['RESULT_TTL'] must be a positive number of "
                f"seconds, not {self.options.get('RESULT_TTL')!r}.",
                id="delayqueue.E005",
            )
        problem = key_argument_problem(self.options.get(KEY_ARGUMENT))
        if problem:
            yield Error(f"TASKS[{self.alias!r}]['OPTIONS']: {problem}.", id="delayqueue.E017")
        for name in sorted(self.queues):
            try:
                validate_name(name, "queue name")
            except ConfigurationError as e:
                yield Error(f"TASKS[{self.alias!r}]['QUEUES']: {e}.", id="delayqueue.E007")
        if self.on_commit and not _databases_configured():
            yield Error(
                "ON_COMMIT cannot be used when no databases are configured.",
                hint=f"Set TASKS[{self.alias!r}]['OPTIONS']['ON_COMMIT'] = False.",
                id="delayqueue.E006",
            )


class TaskArgumentError(PayloadError, TypeError):
    """An argument that is not JSON: a ``TypeError``, as Django documents (its own backends say
    "Unsupported type: ..."), and a ``PayloadError`` as every payload this app refuses."""


def _json_arguments(
    task: Any, args: Iterable[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` as JSON gives them back; an error naming the first bad one.

    What the framework's ``TaskResult`` normalises (a tuple, bytes) is normalised the same way
    first; what stays (a datetime, a set, NaN) raises :class:`TaskArgumentError`.
    """
    args = list(args)
    # Plain scalars (a str, an int, a float, True, None, as most tasks take): JSON gives each
    # back as it is and the framework normalises none, so one encoding checks them all (a NaN,
    # a lone surrogate, the size), and no argument is encoded twice or decoded again. What it
    # refuses goes the long way below, which names the argument.
    if (
        _FLAT.issuperset(map(type, args))
        and _FLAT.issuperset(map(type, kwargs.values()))
        and all(type(key) is str for key in kwargs)
    ):
        try:
            encode_payload({"args": args, "kwargs": kwargs})
        except PayloadError:
            pass
        else:
            return args, dict(kwargs)
    normalize = framework.normalize_json or (lambda value: value)
    named = [(f"argument {i + 1}", value) for i, value in enumerate(args)]
    named += [(f"keyword argument {key!r}", value) for key, value in kwargs.items()]
    for what, value in named:
        where = f"task {task.module_path}: {what}"
        try:
            encode_payload(normalize(value))
        except PayloadError as e:
            detail = str(e).removeprefix("payload ")
            if isinstance(e.__cause__, (TypeError, ValueError)):  # not JSON
                raise TaskArgumentError(f"{where} {detail}") from e
            raise PayloadError(f"{where} {detail}") from e  # too large
        except (TypeError, ValueError) as e:  # the framework's: "Unsupported type: ..."
            raise TaskArgumentError(f"{where} is not JSON-serialisable: {e}") from e
    values = {"args": normalize(args), "kwargs": normalize(dict(kwargs))}
    decoded = json.loads(encode_payload(values))
    return decoded["args"], decoded["kwargs"]


_FLAT = frozenset({str, int, float, bool, type(None)})


def _seconds(value: Any) -> int:
    """A whole number of seconds, or 0 (reported by check(): E005) for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value) if value == value and value not in (float("inf"), float("-inf")) else 0


def _databases_configured() -> bool:
    from django.db import connections

    return bool(connections.settings)
