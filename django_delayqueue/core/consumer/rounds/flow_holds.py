"""What a consumer knows of its queues' flow limits (core/flow_limits.py): which queues a
limit holds back, and until when; and the wake-up it owes consumers waiting on a cap.

A claim held back by a limit answers when the next message may start (claim.lua); the round trip
(:mod:`.rounds.round_trip`) notes it here. A queue held until a known instant (a rate's next token)
makes the next round due for the queue then, and its ready messages do not make one due before: the
consumer sleeps instead of polling. A queue held by ``max_in_flight`` waits for a message in flight
to end: announced on its wake channel by whichever process records the end
(:func:`wake_for_freed_slots` in a round or while a consumer stops, :func:`wake_after` for the
supervisor's settling of a stopped handler and for a reap that retried timed-out deliveries), and
found by the idle poll otherwise (a wake lost with its connection).

Flow keys' limits (``key_concurrency``, ``key_rate_limit``) hold a queue when no key with
ready messages may start one: until a key's next token (a known instant), or until a delivery of
a key ends (woken as for ``max_in_flight``). Messages promoted meanwhile may be of a key that
can start: a hold until a slot frees is dropped then, and the next round claims.

How long each claimed message waited on a limit is the claim's to say (claim.lua, kept on the
server whichever consumer claims: lua/includes/limit_waits.lua), not this consumer's: a
consumer that refills one free slot at a time is never held itself, while its messages waited
on the cap all along. :func:`wake_for_freed_slots` tells the claim when the slots freed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptBatch
from django_delayqueue.core.scripts.contracts import SLOT_FREED

logger = logging.getLogger(__name__)


class FlowHolds:
    """The queues a flow limit holds back: until when (ms; ``math.inf``: until a slot frees)."""

    def __init__(self) -> None:
        self.until: dict[str, float] = {}

    def holds(self, name: str) -> bool:
        """Whether queue ``name``'s last claim was held back by a limit."""
        return name in self.until

    def waits_for_token(self) -> bool:
        """Whether a rate limit holds back ready messages until a known instant: what is due
        then is not done yet (a burst run waits for it). A wait on ``max_in_flight`` is not:
        the slots are another consumer's to free."""
        return any(until != math.inf for until in self.until.values())

    def promoted(self, name: str) -> None:
        """Messages of queue ``name`` reached ready: a hold until a slot frees ends (they may
        be of a flow key that has a slot; a claim held by ``max_in_flight`` says so again)."""
        if self.until.get(name) == math.inf:
            del self.until[name]

    def note(self, name: str, until: int | None, next_wake: dict[str, int | None]) -> None:
        """Queue ``name``'s claim was held back until ``until`` (-1: until a slot frees), or
        not (None). A known instant makes a round due for the queue then (in ``next_wake``,
        the round trip's due times by queue)."""
        if until is None:
            self.until.pop(name, None)
            return
        if until < 0:
            self.until[name] = math.inf
        else:
            self.until[name] = until
            due = next_wake.get(name)
            next_wake[name] = until if due is None else min(due, until)


def waits_on_slots(q: Queue) -> bool:
    """Whether claims of ``q`` may wait for a delivery to end: a cap of the queue or of a key."""
    return q.settings.max_in_flight is not None or q.settings.key_concurrency is not None


def wake_for_freed_slots(
    batch: ScriptBatch, queues: Sequence[Queue], recorded: Sequence[Any], now_ms: int
) -> None:
    """After the outcomes of capped queues (``max_in_flight``) in ``recorded``, recorded at
    ``now_ms``, wake the consumers whose claims wait on the cap (slot_freed.lua, which also
    notes since when a slot is free): one call per such queue with outcomes this round, none
    for the others."""
    for q in queues:
        if waits_on_slots(q) and any(sent[0] is q for sent in recorded):
            channel = q.keys.wake_channel
            batch.add(SLOT_FREED.call(q.keys, wake_channel=channel, now_ms=now_ms))


def wake_after(q: Queue, freed: int) -> None:
    """After ``freed`` messages of ``q`` ended outside a round (settled by the supervisor,
    retried by a reap), wake the consumers waiting on its cap: one call, only for a capped
    queue that freed something. A failure is logged: their idle poll finds the slots."""
    if freed <= 0 or not waits_on_slots(q):
        return
    try:
        call = SLOT_FREED.call(q.keys, wake_channel=q.keys.wake_channel, now_ms=q.clock.now_ms())
        call.run(q.client)
    except DelayQueueError as e:
        logger.info("queue %s: consumers waiting on its cap not woken: %s", q.name, e)
