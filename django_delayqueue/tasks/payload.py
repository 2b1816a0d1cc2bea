"""How a task travels and what Redis keeps of it: its message payload and its result record.

Nothing here imports the Tasks framework, so ``runqueue`` and the admin read both without it.

    {"django.task": "shop.tasks.send_sms", "args": [7], "kwargs": {}, "backend": "default"}

The admin, the stats and the journal show a task like any other message; ``runqueue`` tells a
task from a signal message by the ``"django.task"`` key. Its result lives next to it, in a hash
under the queue's hash tag (``QueueKeys.task_result``), one field per fact so that a worker
writes what changed without reading the record first:

- ``enqueued``: JSON of what enqueue knew (task, queue, priority, backend, args, kwargs,
  run_after, enqueued_at), written with the message by enqueue_task.lua;
- ``status``, and ``started_at``, ``last_attempted_at``, ``finished_at`` (epoch milliseconds,
  the queue's clock);
- ``worker:<token>`` and ``error:<token>`` per delivery (its token: numbers that only grow, so
  they order the attempts), and ``return_value`` (JSON);
- ``order``: the order (``write_order``) of the latest status written, so that a write that
  lands late leaves the status (and finished_at, return_value, the expiry) of a later one.

A finished record gets the backend's ``RESULT_TTL``; before that it has none: a task due in a
month keeps its record until it ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core.errors import CorruptEnvelope

# The record's statuses, field names and write order live in the core (the consumer writes a
# stopped task's end with them, and the core imports nothing above it); re-exported here for
# the Tasks backend's modules.
from django_delayqueue.core.task_records import (
    ENQUEUED,
    ERROR_PREFIX,
    FAILED,
    FINISHED,
    FINISHED_AT,
    LAST_ATTEMPTED_AT,
    ORDER,
    READY,
    RETURN_VALUE,
    RUNNING,
    STARTED_AT,
    STATUS,
    SUCCESSFUL,
    WORKER_PREFIX,
    write_order,
)

__all__ = [
    "ENQUEUED",
    "ERROR_PREFIX",
    "FAILED",
    "FINISHED",
    "FINISHED_AT",
    "LAST_ATTEMPTED_AT",
    "ORDER",
    "READY",
    "RETURN_VALUE",
    "RUNNING",
    "STARTED_AT",
    "STATUS",
    "SUCCESSFUL",
    "TASK_KEY",
    "WORKER_PREFIX",
    "DeadLettered",
    "TaskRecord",
    "is_task_payload",
    "task_payload",
    "write_order",
]

TASK_KEY = "django.task"


def task_payload(
    path: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    *,
    priority: int = 0,
    deferred: bool = False,
) -> dict[str, Any]:
    """A task's message payload: what its worker needs to run it and to write its result
    without reading it first (a priority other than 0, and whether ``run_after`` was given,
    whose time is the message's due time)."""
    payload: dict[str, Any] = {TASK_KEY: path, "args": args, "kwargs": kwargs, "backend": backend}
    if priority:
        # The framework lets a whole float through (priority=5.0): the worker reads an int.
        payload["priority"] = int(priority)
    if deferred:
        payload["run_after"] = True
    return payload


class DeadLettered(Exception):
    """A task's message went to the dead letters (or away) without a run of it failing: its
    consumer stopped or died on the last attempt, no handler took it, it was cancelled. The
    class of the error ``get_result`` lists for it, with the reason."""


def is_task_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get(TASK_KEY), str)


@dataclass(slots=True)  # a worker makes one per task: its fields set and read a little faster
class TaskRecord:
    """What Redis holds for one task result (a hash: see the module's docstring)."""

    task: str  # the Task's module path
    queue: str
    priority: int
    backend: str
    args: list[Any]
    kwargs: dict[str, Any]
    status: str = READY
    run_after: int | None = None
    enqueued_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    last_attempted_at: int | None = None
    errors: list[dict[str, str]] = field(default_factory=list)
    worker_ids: list[str] = field(default_factory=list)
    return_value: Any = None

    def enqueued_json(self) -> str:
        """The ``enqueued`` field: what enqueue knew."""
        values = {name: getattr(self, name) for name in _ENQUEUED_FIELDS}
        return _ENQUEUED_ENCODER.encode(values)

    @classmethod
    def from_hash(cls, stored: dict[Any, Any]) -> TaskRecord:
        """The record of a hash as HGETALL returns it (bytes or str); CorruptEnvelope if bad."""
        try:
            fields_ = {_text(k): _text(v) for k, v in stored.items()}
            record = cls(**json.loads(fields_[ENQUEUED]))
            record.status = fields_.get(STATUS, READY)
            record.started_at = _ms(fields_.get(STARTED_AT))
            record.last_attempted_at = _ms(fields_.get(LAST_ATTEMPTED_AT))
            record.finished_at = _ms(fields_.get(FINISHED_AT))
            record.worker_ids = _per_delivery(fields_, WORKER_PREFIX)
            record.errors = [json.loads(e) for e in _per_delivery(fields_, ERROR_PREFIX)]
            if RETURN_VALUE in fields_:
                record.return_value = json.loads(fields_[RETURN_VALUE])
            return record
        except (KeyError, ValueError, TypeError, RecursionError) as e:
            # RecursionError: a return value nested too deep, stored by an earlier version.
            raise CorruptEnvelope(f"corrupt task result record: {e!r}") from e

    @classmethod
    def from_payload(
        cls, payload: dict[str, Any], queue: str, due_ms: int, enqueued_ms: int
    ) -> TaskRecord:
        """The record as enqueue wrote it, from the task's message (see ``task_payload``)."""
        # Positional, and the priority read only where given: a worker builds one per task.
        get = payload.get
        priority = get("priority")
        return cls(
            payload[TASK_KEY],
            queue,
            0 if priority is None else _priority(priority),
            str(get("backend") or "default"),
            list(get("args") or ()),
            dict(get("kwargs") or {}),
            READY,
            due_ms if get("run_after") else None,
            enqueued_ms,
        )

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


_ENQUEUED_FIELDS = (
    "task", "queue", "priority", "backend", "args", "kwargs", "run_after", "enqueued_at",
)  # fmt: skip


# One encoder, not json.dumps(..., separators=...) that builds one per call: a worker encodes
# this field for every delivery of a task.
_ENQUEUED_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _priority(value: Any) -> int:
    """A payload's priority: a whole number (5.0 is 5, as an older enqueue wrote it), else 0."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return int(value) if whole else 0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(value: str | None) -> int | None:
    return None if value is None else int(value)


def _per_delivery(stored: dict[str, str], prefix: str) -> list[str]:
    """The values of ``<prefix><token>`` fields, in the order of their delivery tokens."""
    found = [(int(k[len(prefix) :]), v) for k, v in stored.items() if k.startswith(prefix)]
    return [value for _, value in sorted(found)]
