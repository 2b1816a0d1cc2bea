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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from django_delayqueue.core.envelope import Message
from django_delayqueue.core.queue import Queue

Settlement = Literal["retry", "dead"]


def time_limit_reason(seconds: float) -> str:
    """The reason a message stopped by its queue's ``time_limit`` is retried with."""
    return f"time limit exceeded ({seconds:g} s)"


def abort_reason(reason: str) -> str:
    """The reason an aborted message reads in the dead letters."""
    return f"aborted: {reason}" if reason else "aborted"


@dataclass(frozen=True)
class StoppedHandler:
    """A message whose handler was stopped: retried (a time limit) or dead (an abort)."""

    queue: str  # the physical queue (a shard's own name for a sharded queue)
    message_id: str
    token: str
    attempt: int
    settlement: Settlement
    reason: str

    @classmethod
    def of(cls, message: Message, settlement: Settlement, reason: str) -> StoppedHandler:
        return cls(message.queue, message.id, message.token, message.attempt, settlement, reason)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StoppedHandler:
        return cls(**json.loads(text))


def settle_stopped(queues: Mapping[str, Queue], stopped: Sequence[StoppedHandler]) -> list[int]:
    """Record the outcome of each stopped message (once its handler can no longer run).

    A retry counts the attempt (dead letters when attempts run out); an abort goes straight to
    the dead letters. A message whose delivery token is no longer current (its visibility
    timeout brought it back meanwhile) is left alone: 0 in the returned list, as from nack.
    """
    results: list[int] = []
    for item in stopped:
        q = queues[item.queue]
        message = Message(item.message_id, item.queue, None, 0, 0, item.attempt, item.token)
        bury = item.settlement == "dead"
        results.extend(q.nack_many([(message, None, item.reason)], bury=bury))
    return results
