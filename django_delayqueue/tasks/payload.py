"""How a task travels and what Redis keeps of it: its message payload and its result record.

Nothing here imports the Tasks framework, so ``runqueue`` and the admin read both without it.

    {"django.task": "shop.tasks.send_sms", "args": [7], "kwargs": {}, "backend": "default"}

The admin, the stats and the journal show a task like any other message; ``runqueue`` tells a
task from a signal message by the ``"django.task"`` key. Its result lives next to it, in a
string key under the queue's hash tag (``QueueKeys.task_result``): a JSON ``TaskRecord`` of the
status and the times (epoch milliseconds, the queue's clock), the errors, the workers and the
return value. The record is written with the message (enqueue_task.lua), rewritten by the
worker as the task starts and ends, and given the backend's ``RESULT_TTL`` only once the task
finished: a task due in a month keeps its record until it ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from django_delayqueue.core.errors import CorruptEnvelope

TASK_KEY = "django.task"


def task_payload(
    path: str, args: list[Any], kwargs: dict[str, Any], backend: str
) -> dict[str, Any]:
    return {TASK_KEY: path, "args": args, "kwargs": kwargs, "backend": backend}


def is_task_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get(TASK_KEY), str)


READY = "READY"
RUNNING = "RUNNING"
FAILED = "FAILED"
SUCCESSFUL = "SUCCESSFUL"  # the framework's own spelling is framework.SUCCESSFUL
FINISHED = frozenset({FAILED, SUCCESSFUL})


@dataclass
class TaskRecord:
    """What Redis holds for one task result (one JSON string)."""

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

    def to_json(self) -> str:
        # Not dataclasses.asdict: it deep-copies every value, a third of a task's run here.
        values = {name: getattr(self, name) for name in _RECORD_FIELDS}
        return json.dumps(values, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: bytes | str) -> TaskRecord:
        try:
            data = json.loads(raw)
            return cls(**data)
        except (ValueError, TypeError) as e:
            raise CorruptEnvelope(f"corrupt task result record: {e}") from e

    @classmethod
    def from_payload(
        cls, payload: dict[str, Any], queue: str, due_ms: int, enqueued_ms: int
    ) -> TaskRecord:
        """A record rebuilt from a task's message, when its own is gone (a key deleted by hand)."""
        return cls(
            task=payload[TASK_KEY],
            queue=queue,
            priority=0,
            backend=str(payload.get("backend") or "default"),
            args=list(payload.get("args") or []),
            kwargs=dict(payload.get("kwargs") or {}),
            run_after=due_ms,
            enqueued_at=enqueued_ms,
        )

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


_RECORD_FIELDS = tuple(f.name for f in fields(TaskRecord))
