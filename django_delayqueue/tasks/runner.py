"""Running one task message in ``runqueue``: its result record, its signals, its outcome.

For each delivery of a task the record goes RUNNING (``started_at`` the first time,
``last_attempted_at`` and a worker id every time) and ``task_started`` is sent; the task runs
(``async def`` ones on an event loop of their own, ``takes_context`` ones with a
``TaskContext``); then:

- it returned: SUCCESSFUL with its JSON return value, ``task_finished``, the message acked;
- it raised and attempts are left: READY again with the error appended, and the exception goes
  on to the consumer, which retries with the queue's backoff (``dq.Retry`` chooses its delay
  and appends no error: a retry asked for is not a failure);
- it raised on its last attempt, or raised ``dq.Reject``: FAILED, ``task_finished``, and the
  message goes to the dead letters with its reason, as any message would.

A finished record gets the backend's ``RESULT_TTL``; before that it has none. The record is
written before the message's ack: if the worker dies between the two, the task runs again
(at-least-once) and its record says so (two worker ids).
"""

from __future__ import annotations

import json
import logging
import traceback
from typing import Any

from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import Reject, Retry
from django_delayqueue.core.queue import Queue
from django_delayqueue.tasks import framework
from django_delayqueue.tasks.payload import (
    FAILED,
    READY,
    RUNNING,
    SUCCESSFUL,
    TASK_KEY,
    TaskRecord,
)
from django_delayqueue.tasks.results import load_task, to_task_result

logger = logging.getLogger(__name__)


class TaskRunner:
    """Runs the task messages of a worker's queues; ``worker_id`` goes into each result."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    def run(self, message: Message, queue: Queue) -> Any:
        """Run the task in ``message``; raise what the consumer must see (retry or reject)."""
        payload = message.payload
        key = queue.keys.task_result(message.id)
        record = self._load(queue, key, message)
        try:
            task = load_task(payload[TASK_KEY])
            backend = framework.task_backends[record.backend]
        except Exception as e:
            self._finish(queue, message.id, record, FAILED, error=e, backend=None)
            raise Reject(f"cannot run task {payload[TASK_KEY]!r}: {e}") from e
        now = queue.clock.now_ms()
        record.status = RUNNING
        record.started_at = record.started_at or now
        record.last_attempted_at = now
        record.worker_ids.append(self.worker_id)
        queue.client.set(key, record.to_json())  # no expiry while it may still run
        result = to_task_result(record, message.id)
        _send_robust(framework.task_started, backend, result)
        try:
            if task.takes_context:
                context = framework.TaskContext(task_result=result)
                value = task.call(context, *record.args, **record.kwargs)
            else:
                value = task.call(*record.args, **record.kwargs)
        except BaseException as e:  # the consumer decides what it means; the record follows
            last = isinstance(e, Reject) or message.attempt >= queue.settings.max_attempts
            try:
                if last:  # what nack.lua will do too: no attempts left, or dead on purpose
                    self._finish(queue, message.id, record, FAILED, error=e, backend=backend)
                else:
                    record.status = READY
                    if not isinstance(e, Retry):  # a retry asked for is not an error
                        record.errors.append(_error(e))
                    queue.client.set(key, record.to_json())
            except Exception:  # the record is secondary: the task's own outcome stands
                logger.exception("queue %s: task %s: result not recorded", queue.name, message.id)
            raise
        try:
            record.return_value = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as e:
            # It ran: running it again would repeat its effects for the same bad value.
            self._finish(queue, message.id, record, FAILED, error=e, backend=backend)
            raise Reject(f"task returned a value that is not JSON: {e}") from e
        self._finish(queue, message.id, record, SUCCESSFUL, backend=backend)
        return value

    def _load(self, queue: Queue, key: str, message: Message) -> TaskRecord:
        raw = queue.client.get(key)
        if raw is not None:
            try:
                return TaskRecord.from_json(raw)
            except Exception as e:
                logger.warning(
                    "queue %s: task result %s unreadable (%s): rebuilt", queue.name, message.id, e
                )
        return TaskRecord.from_payload(
            message.payload, queue.name, message.due_ms, message.scheduled_ms
        )

    def _finish(
        self,
        queue: Queue,
        message_id: str,
        record: TaskRecord,
        status: str,
        *,
        error: BaseException | None = None,
        backend: Any,
    ) -> None:
        record.status = status
        record.finished_at = queue.clock.now_ms()
        if error is not None:
            record.errors.append(_error(error))
        ttl = getattr(backend, "result_ttl", None) or _default_ttl()
        queue.client.set(queue.keys.task_result(message_id), record.to_json(), ex=int(ttl))
        if backend is not None:
            _send_robust(framework.task_finished, backend, to_task_result(record, message_id))


def _send_robust(signal: Any, backend: Any, result: Any) -> None:
    """Send a task signal; a receiver that raises is logged, and changes nothing of the task."""
    for receiver, response in signal.send_robust(type(backend), task_result=result):
        if isinstance(response, BaseException):
            logger.error(
                "task %s: receiver %s of a task signal raised",
                result.id,
                getattr(receiver, "__qualname__", receiver),
                exc_info=response,
            )


def _error(error: BaseException) -> dict[str, str]:
    kind = type(error)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def _default_ttl() -> int:
    from django_delayqueue.tasks.backend import DEFAULT_RESULT_TTL

    return DEFAULT_RESULT_TTL
