"""What the consumer's next round claims, and when it is due: :class:`RoundPlanner`.

The loop (:mod:`.loop`) decides *that* a round runs; its planner says what the round may claim
(each queue's room, the claim lead's aim, the ``max_messages`` budget, what is given back
unstarted at a stop) and *when* one is due (something due or ready now, the next poll or
maintenance, an outcome waiting to be recorded). Apart from the loop class so that the loop
reads as the loop; these are asked by it once a round, never per message.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from django_delayqueue.core.clock import Clock
from django_delayqueue.core.consumer.handlers.threads_by_queue import ThreadsByQueue
from django_delayqueue.core.consumer.rounds.parts import Keeper
from django_delayqueue.core.consumer.rounds.round_trip import RoundTrip
from django_delayqueue.core.consumer.rounds.waiter import MAX_CLAIM_LEAD_MS, Wake
from django_delayqueue.core.consumer.start_marks import StartMarks
from django_delayqueue.core.consumer.stopping import StopRequests
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.queue import Queue


class RoundPlanner:
    """Sizes the consumer's next claim and tells when its next round is due.

    ``queues`` is the consumer's own list (it grows with ``Consumer.add_queues``). What it
    keeps: ``claimed_total`` (claimed and not given back unstarted: the ``max_messages``
    budget), ``aim`` (the wait that ended just before the next round, used once by
    :meth:`fetch`), ``polling`` (whether that round is only the idle safety poll: it claims only
    where something is known to be ready) and ``next_maintenance`` (monotonic seconds).
    """

    def __init__(
        self,
        queues: list[Queue],
        clock: Clock,
        keeper: Keeper,
        round_trip: RoundTrip,
        threads: ThreadsByQueue,
        stop: StopRequests,
        monotonic: Callable[[], float],
        max_messages: int | None,
        start_marks: StartMarks,
    ) -> None:
        self._queues = queues
        self._marks = start_marks
        self._clock = clock
        self._keeper = keeper
        self._round_trip = round_trip
        self._threads = threads
        self._stop = stop
        self._monotonic = monotonic
        self.max_messages = max_messages
        self.claimed_total = 0
        self.aim: Wake | None = None
        self.polling = False
        self.next_maintenance = -math.inf

    # --- what a round claims ----------------------------------------------------------------------

    def fetch(self, now_ms: int | None = None, *, maintenance: bool = False) -> list[Message]:
        """One round trip (:meth:`RoundTrip.run`); returns the claimed messages.

        After a wait that ended one claim lead early (``aim``), it claims what is due by the
        time the wait aimed at; the handler threads hold those messages until they are due.
        """
        aim, self.aim = self.aim, None  # an aim is used once
        poll, self.polling = self.polling, False
        now = self._clock.now_ms() if now_ms is None else now_ms
        claim_until = now
        aimed = None if now_ms is not None or aim is None else aim.due_ms
        if aimed is not None and 0 < aimed - now <= MAX_CLAIM_LEAD_MS:
            claim_until = aimed
        room = {q.name: self.room(q) for q in self._queues}
        budget = None if self.max_messages is None else self.max_messages - self.claimed_total
        done = self._round_trip.run(
            now, claim_until, room, budget, poll=poll, maintenance=maintenance
        )
        self.claimed_total += len(done.claimed)
        if done.reap_again:
            self.next_maintenance = -math.inf
        return done.claimed

    def room(self, q: Queue) -> int:
        """How many messages of ``q`` the next round may claim: none while ``q`` is paused or
        the consumer stops; else what its threads have room for, one claim batch at most."""
        if q.settings.paused or self._stop.stopping:
            return 0
        batch = q.settings.claim_batch
        threads = self._threads.get(q.name)
        return batch if threads is None else min(batch, threads.room(batch))

    def release_unstarted(self) -> None:
        """Hold every thread and give back what was claimed but not started (no attempt used)."""
        for q in self._queues:
            unstarted = self._threads.hold_and_take_unstarted(q.name)
            if unstarted:
                self.claimed_total -= len(unstarted)
                # Their marks go once they are back, not before: a process killed in between
                # leaves them to its supervisor (a token no longer current is skipped). Kept
                # when Redis refused: the supervisor gives them back once this process is gone.
                if self._round_trip.give_back(q, unstarted):
                    for m in unstarted:
                        self._marks.clear(m)

    # --- when the next round is due -------------------------------------------------------------

    def maintenance_due(self) -> bool:
        return self._monotonic() >= self.next_maintenance

    def maintained(self, every_seconds: float) -> None:
        """A maintenance round ran: the next is due ``every_seconds`` from now."""
        self.next_maintenance = self._monotonic() + every_seconds

    def due_now(self, now: int | None = None) -> bool:
        """Whether the next round has work now: something due, or ready and room to claim it."""
        now = self._clock.now_ms() if now is None else now
        if self._round_trip.due_by(now):
            return True
        if self._stop.stopping:
            return False
        if self._keeper.needs_round(now):
            return True
        under_limit = self.max_messages is None or self.claimed_total < self.max_messages
        return under_limit and any(
            self._round_trip.has_ready(q) and self.room(q) > 0 for q in self._queues
        )

    def poll_at(self, idle_ms: int) -> int:
        """When to look again even if nothing is known to be due: a poll (``idle_ms`` from
        now at the latest) or maintenance."""
        # Rounded up: a wait that ended before the (monotonic) maintenance time would find
        # no maintenance due, and wait again for a fraction of a millisecond.
        left = max(0.0, self.next_maintenance - self._monotonic())
        maintenance_in = math.ceil(left * 1000)
        wait_ms = min(idle_ms, maintenance_in + 1)
        # An outcome that no round trip was worth waking for (a quick queue with messages
        # still claimed) is recorded within RECORD_WITHIN_SECONDS of its handler's end.
        record_in = self._threads.record_due_in()
        if record_in is not None:
            wait_ms = min(wait_ms, math.ceil(record_in * 1000))
        return self._clock.now_ms() + wait_ms
