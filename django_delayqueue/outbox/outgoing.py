"""A message on its way to Redis: what ``dq.schedule`` and the Tasks backend hand to the outbox."""

from __future__ import annotations

from dataclasses import dataclass

from django_delayqueue.core.logical_queue import LogicalQueue
from django_delayqueue.core.results import Prepared, ScheduleResult


@dataclass(frozen=True)
class Outgoing:
    """One prepared message of ``queue``; a task's when ``record`` (its enqueued JSON) is set."""

    queue: LogicalQueue
    prepared: Prepared
    replace: bool = False
    record: str | None = None
    priority: int = 0
    unique_ms: int = 0  # the uniqueness window of schedule(..., unique_for=), ms; 0: none

    @property
    def mode(self) -> str:
        """How send_once.lua stores it: ``"schedule"``, ``"replace"`` or ``"task"``."""
        if self.record is not None:
            return "task"
        return "replace" if self.replace else "schedule"

    def send(self) -> ScheduleResult:
        """Send it now (no outbox): one script call; DelayQueueError if Redis refuses."""
        self._register_task_queue()
        if self.record is not None:
            key = self.queue.keys_for(self.prepared.id).task_result(self.prepared.id)
            return self.queue.send_with_record(
                self.prepared, key, self.record, priority=self.priority
            )
        return self.queue.send_prepared(
            self.prepared, replace=self.replace, unique_ms=self.unique_ms
        )

    def send_once(self, token: str) -> ScheduleResult | None:
        """Send it under ``token`` (an outbox row's): None if that token was sent already."""
        self._register_task_queue()
        message_id = self.prepared.id
        key = (
            None if self.record is None else self.queue.keys_for(message_id).task_result(message_id)
        )
        return self.queue.send_once(
            self.prepared,
            token,
            replace=self.replace,
            record_key=key,
            record=self.record,
            priority=self.priority,
            unique_ms=self.unique_ms,
        )

    def _register_task_queue(self) -> None:
        """A task's queue that no TASKS backend lists (one of ``"QUEUES": []``): in the
        registry before its message, so that runqueue finds it (conf.task_registry)."""
        if self.record is not None:
            from django_delayqueue.conf.task_registry import register_unlisted

            register_unlisted(self.queue.name)
