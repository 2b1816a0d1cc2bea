"""Writes to a task's result record: the hash beside its message (``QueueKeys.task_result``).

A mixin of :class:`~django_delayqueue.core.queue.Queue` (which provides ``client``, ``name``
and ``keys``). What the fields mean is the Tasks backend's (django_delayqueue.tasks.payload);
how a write lands whatever order writes arrive in is ``write_record.lua``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.calls import ScriptCall, redis_errors
from django_delayqueue.core.scripts.contracts import WRITE_RECORD


class TaskRecords:
    client: RedisClient
    name: str
    keys: QueueKeys

    def record_write_call(
        self,
        message_id: str,
        *,
        order: int,
        kept_seconds: int = 0,
        absent: Sequence[Any] = (),
        in_order: Sequence[Any] = (),
        deleted: Sequence[str] = (),
        always: Sequence[Any] = (),
    ) -> ScriptCall:
        """The write of fields of the result record of ``message_id``, to run alone or with
        the consumer's round trip: the field, value pairs ``absent`` set where the field is
        not there yet, ``in_order`` set and the fields ``deleted`` removed only when ``order``
        is not below the record's (with the expiry: ``kept_seconds`` from now, 0 for none),
        and the pairs ``always`` set whatever the order."""
        return WRITE_RECORD.call(
            record=self.keys.task_result(message_id),
            kept_seconds=kept_seconds,
            order=order,
            absent_pairs=len(absent) // 2,
            order_pairs=len(in_order) // 2,
            deleted_fields=len(deleted),
            fields=[*absent, *in_order, *deleted, *always],
        )

    def load_record_script(self) -> None:
        """Load the script of record writes ahead of the first (a NOSCRIPT costs a trip)."""
        with redis_errors(f"loading scripts on {self.name}"):
            self.client.script_load(WRITE_RECORD.script.source)
