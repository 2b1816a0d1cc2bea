"""What the consumer's next round claims, and when it is due.

A mixin of :class:`.loop.Consumer`. The loop (:mod:`.loop`) decides *that* a round runs; this
says what it may claim (each queue's room, the claim lead's aim, the ``max_messages`` budget
kept in ``_claimed_total``, what is given back unstarted at a stop) and *when* one is due
(something due or ready now, the next poll or maintenance, an outcome waiting to be recorded).
Apart from the loop class so that the loop reads as the loop; these are asked by it once a
round, never per message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_delayqueue.core.clock import Clock
from django_delayqueue.core.consumer.round_parts import Keeper
from django_delayqueue.core.consumer.rounds import RoundTrip
from django_delayqueue.core.consumer.threads_by_queue import ThreadsByQueue
from django_delayqueue.core.consumer.waiter import MAX_CLAIM_LEAD_MS, Wake
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.queue import Queue


class RoundPlanning:
    """Sizes the consumer's next claim and tells when its next round is due."""

    announce_within_ms: int  # the Consumer's (class attribute)
    # The Consumer's (set in its __init__).
    queues: list[Queue]
    clock: Clock
    keeper: Keeper
    max_messages: int | None
    idle_seconds: float
    delivered: int
    _claimed_total: int
    _monotonic: Callable[[], float]
    _next_maintenance: float
    _round_trip: RoundTrip
    _threads: ThreadsByQueue
    _aim: Wake | None
    _polling: bool

    if TYPE_CHECKING:  # the Consumer's

        @property
        def stopping(self) -> bool: ...

    # --- what a round claims ----------------------------------------------------------------------

    def _fetch(self, now_ms: int | None = None, *, maintenance: bool = False) -> list[Message]:
        """One round trip (:meth:`RoundTrip.run`); returns the claimed messages.

        After a wait that ended one claim lead early (``_aim``), it claims what is due by the
        time the wait aimed at; the handler threads hold those messages until they are due.
        """
        aim, self._aim = self._aim, None  # an aim is used once
        poll, self._polling = self._polling, False
        now = self.clock.now_ms() if now_ms is None else now_ms
        claim_until = now
        aimed = None if now_ms is not None or aim is None else aim.due_ms
        if aimed is not None and 0 < aimed - now <= MAX_CLAIM_LEAD_MS:
            claim_until = aimed
        room = {q.name: self._room(q) for q in self.queues}
        budget = None if self.max_messages is None else self.max_messages - self._claimed_total
        done = self._round_trip.run(
            now, claim_until, room, budget, poll=poll, maintenance=maintenance
        )
        self._claimed_total += len(done.claimed)
        if done.reap_again:
            self._next_maintenance = -math.inf
        return done.claimed

    def _room(self, q: Queue) -> int:
        """How many messages of ``q`` the next round may claim: none while ``q`` is paused or
        the consumer stops; else what its threads have room for, one claim batch at most."""
        if q.settings.paused or self.stopping:
            return 0
        batch = q.settings.claim_batch
        threads = self._threads.get(q.name)
        return batch if threads is None else min(batch, threads.room(batch))

    def _release_unstarted(self) -> None:
        """Hold every thread and give back what was claimed but not started (no attempt used)."""
        for q in self.queues:
            unstarted = self._threads.hold_and_take_unstarted(q.name)
            if unstarted:
                self._claimed_total -= len(unstarted)
                self._round_trip.give_back(q, unstarted)

    # --- when the next round is due -------------------------------------------------------------

    def _limit_reached(self) -> bool:
        return self.max_messages is not None and self.delivered >= self.max_messages

    def _due_now(self, now: int | None = None) -> bool:
        """Whether the next round has work now: something due, or ready and room to claim it."""
        now = self.clock.now_ms() if now is None else now
        if self._round_trip.due_by(now):
            return True
        if self.stopping:
            return False
        if self.keeper.needs_round(now):
            return True
        under_limit = self.max_messages is None or self._claimed_total < self.max_messages
        return under_limit and any(
            self._round_trip.has_ready(q) and self._room(q) > 0 for q in self.queues
        )

    def _poll_at(self) -> int:
        """When to look again even if nothing is known to be due: a poll or maintenance."""
        # Never past the producers' announce horizon: a message due later than that is not
        # announced, and is found by reading the pending head at this poll.
        idle_ms = min(int(self.idle_seconds * 1000), self.announce_within_ms)
        # Rounded up: a wait that ended before the (monotonic) maintenance time would find
        # no maintenance due, and wait again for a fraction of a millisecond.
        left = max(0.0, self._next_maintenance - self._monotonic())
        maintenance_in = math.ceil(left * 1000)
        wait_ms = min(idle_ms, maintenance_in + 1)
        # An outcome that no round trip was worth waking for (a quick queue with messages
        # still claimed) is recorded within RECORD_WITHIN_SECONDS of its handler's end.
        record_in = self._threads.record_due_in()
        if record_in is not None:
            wait_ms = min(wait_ms, math.ceil(record_in * 1000))
        return self.clock.now_ms() + wait_ms
