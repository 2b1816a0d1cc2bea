"""Handlers the consumer had to stop (a time limit, an abort), and settling their messages.

A handler thread cannot be killed. When one does not end after being told to (an exception
raised in it), its process must go: the consumer reports the messages whose handlers it could
not stop (:class:`StoppedHandler`) through ``Consumer.replacement_needed``, stops as on SIGTERM
(the other handlers finish or are given back) and exits; the supervisor starts a replacement at
once and, only once the old process is gone (so the stopped handler can never run beside its
own redelivery), records each stopped message's outcome with :func:`settle_stopped`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from django_delayqueue.core.consumer.rounds.flow_holds import wake_after
from django_delayqueue.core.delivery import NACK_ABORTED, NACK_DEAD, nack_aborted_reasons
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.log_fields import message_fields
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptCall

logger = logging.getLogger(__name__)

Settlement = Literal["retry", "dead"]


def time_limit_reason(seconds: float) -> str:
    """The reason a message stopped by its queue's ``time_limit`` is retried with."""
    return f"time limit exceeded ({seconds:g} s)"


def abort_reason(reason: str) -> str:
    """The reason an aborted message reads in the dead letters."""
    return f"aborted: {reason}" if reason else "aborted"


# The log line of a handler stopped as aborted when its time limit came in the abort's grace
# (the abort wins over a limit: its message goes to the dead letters as aborted, not retried).
# Arguments: queue, message id, " (<abort reason>)" or "", the time limit in seconds.
ABORTED_AT_TIME_LIMIT = "queue %s: message %s aborted%s and at its time limit (%g s): stopping it"


# What an outcome says of an abort learnt only from its nack (it came after its handler ended
# or was stopped at a limit, before its outcome was recorded) when nack.lua did not give the
# dead letter's reason ("aborted: <the abort's reason>", which it gives after its codes).
LATE_ABORT_REASON = "aborted"


def abort_said(reason: str) -> str:
    """How a log line names an abort's own reason: " (<reason>)", or nothing."""
    return f" ({reason})" if reason else ""


def stop_at_time_limit(
    message: Message, seconds: float, aborted: str | None
) -> tuple[Settlement, str]:
    """How a handler still running at its time limit (``seconds``) is stopped, and the log line
    that says so, the same for a thread and a coroutine (the one watchdog decides both): retried
    with :func:`time_limit_reason`; or, once aborted (``aborted``: the abort's own reason, ""
    for none), as the abort, to the dead letters: an abort wins over a limit that comes in its
    grace, so that the log, the journal and the dead letters tell one story."""
    fields = message_fields(message)
    if aborted is None:
        reason = time_limit_reason(seconds)
        logger.warning(
            "queue %s: message %s (attempt %d): %s, stopping its handler",
            message.queue,
            message.id,
            message.attempt,
            reason,
            extra=fields,
        )
        return "retry", reason
    said = abort_said(aborted)
    logger.warning(ABORTED_AT_TIME_LIMIT, message.queue, message.id, said, seconds, extra=fields)
    return "dead", abort_reason(aborted)


@dataclass(frozen=True)
class StoppedHandler:
    """A message whose handler was stopped: retried (a time limit) or dead (an abort)."""

    queue: str  # the physical queue (a shard's own name for a sharded queue)
    message_id: str
    token: str
    attempt: int
    settlement: Settlement
    reason: str
    task: bool = False  # a task's message: its result record is written too

    @classmethod
    def of(cls, message: Message, settlement: Settlement, reason: str) -> StoppedHandler:
        return cls(
            message.queue,
            message.id,
            message.token,
            message.attempt,
            settlement,
            reason,
            message.task,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StoppedHandler:
        """From :meth:`to_json`, maybe of another release: a field this one does not know is
        left out; TypeError when one it needs is missing."""
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def settle_stopped(queues: Mapping[str, Queue], stopped: Sequence[StoppedHandler]) -> list[int]:
    """Record the outcome of each stopped message (once its handler can no longer run).

    A retry counts the attempt (dead letters when attempts run out); an abort goes straight to
    the dead letters. A message whose delivery token is no longer current (its visibility
    timeout brought it back meanwhile) is left alone: 0 in the returned list, as from nack.
    A task's result record says what became of it: READY (to be retried) or FAILED, with the
    stop (``TimeLimitExceeded`` or ``Aborted`` and the reason) among its errors. An abort that
    came after a time limit's stop, before this, wins (nack.lua dead-letters it as aborted,
    :data:`NACK_ABORTED`): its record says ``Aborted``, as its dead letter does.
    """
    results: list[int] = []
    for item in stopped:
        q = queues[item.queue]
        message = Message(item.message_id, item.queue, None, 0, 0, item.attempt, item.token)
        bury = item.settlement == "dead"
        reply = q.nack_call([(message, None, item.reason)], q.clock.now_ms(), bury).run(q.client)
        result = int(reply[0])
        results.append(result)
        wake_after(q, 1 if result else 0)  # a slot of its cap is free (consumers may wait)
        if item.task and result:
            if result == NACK_ABORTED and item.settlement != "dead":
                (reason,) = nack_aborted_reasons(reply, 1) or [LATE_ABORT_REASON]
                item = replace(item, settlement="dead", reason=reason)
            record_stop(q, item, dead=result in (NACK_DEAD, NACK_ABORTED)).run(q.client)
    return results


def record_stop(q: Queue, item: StoppedHandler, *, dead: bool) -> ScriptCall:
    """The write of a stopped task's end to its result record: FAILED (its message is dead)
    or READY (retried), with the stop as this delivery's error."""
    from django_delayqueue.core.housekeeping import ENDED_RECORD_TTL_SECONDS
    from django_delayqueue.core.task_records import (
        ERROR_PREFIX,
        FAILED,
        FINISHED_AT,
        READY,
        RETURN_VALUE,
        STATUS,
        write_order,
    )

    kind = "Aborted" if item.settlement == "dead" else "TimeLimitExceeded"
    error = {
        "exception_class_path": f"django_delayqueue.core.errors.{kind}",
        "traceback": f"django_delayqueue.core.errors.{kind}: {item.reason}\n",
    }
    status = FAILED if dead else READY
    in_order: list[Any] = [STATUS, status]
    deleted = [RETURN_VALUE]
    if dead:
        in_order += (FINISHED_AT, q.clock.now_ms())
    else:
        deleted.append(FINISHED_AT)
    return q.record_write_call(
        item.message_id,
        order=write_order(item.token, status),
        kept_seconds=ENDED_RECORD_TTL_SECONDS if dead else 0,
        in_order=in_order,
        deleted=deleted,
        always=[f"{ERROR_PREFIX}{item.token}", json.dumps(error)],
    )
