"""Pushing out the visibility deadline of messages a consumer still holds.

Each queue is extended on its own schedule, a third of its *current* visibility timeout (so a
timeout lowered in the admin takes effect in a running consumer), through its own Redis client,
and a queue whose extend fails never keeps another queue's messages from being extended.

A timeout *raised* while handlers run is another matter: the running leases were last set with
the old one, and a renewal interval grown at once (a third of the new timeout) would come after
they end, so another consumer would deliver their messages again beside the running handlers.
So a raise first extends every lease of the queue with the new timeout, at once (within a
tick), and only once Redis has them does the interval grow; until then (an extend that failed,
nothing held yet) the queue is renewed at the old, shorter interval.

Each tick also sends the progress its handlers reported since the last one
(:mod:`.handlers.progress_reports`): the thread wakes every tick anyway, so a report waits at most a
tick, and a consumer whose handlers report nothing makes no call for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from django_delayqueue.core.consumer.handlers.progress_reports import send_reports
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)

# How often the thread looks whether a queue is due (costs no Redis call), and the longest a
# progress report waits to be sent.
TICK_SECONDS = 0.2
SHORTEST_INTERVAL_SECONDS = 0.2


def extend_interval(visibility_timeout: float) -> float:
    """Seconds between two extensions of leases set with ``visibility_timeout``: a third."""
    return max(SHORTEST_INTERVAL_SECONDS, visibility_timeout / 3)


class Extender:
    """A thread that extends the deadlines of ``in_flight(queue name)`` for every queue."""

    def __init__(
        self,
        queues: Sequence[Queue],
        in_flight: Callable[[str], list[Message]],
        tick_seconds: float = TICK_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queues = list(queues)
        self._in_flight = in_flight
        self._tick = tick_seconds
        self._monotonic = monotonic
        started = monotonic()
        self._extended_at = {q.name: started for q in self._queues}
        # Per queue: the visibility timeout its running leases were last set with (by the
        # claims, then by the last extension Redis took), and the one last tried (a raise is
        # tried at once, once; after a failure, again at the old interval).
        self._lease_seconds = {q.name: q.settings.visibility_timeout for q in self._queues}
        self._tried_seconds = dict(self._lease_seconds)
        self._stop = threading.Event()
        self._lingering = False  # extending only the abandoned, until none is left
        self._thread = threading.Thread(target=self._run, name="delayqueue-extender", daemon=True)
        self._thread.start()

    def add(self, q: Queue) -> None:
        """Extend ``q``'s messages too (a queue added to the running consumer)."""
        self._extended_at[q.name] = self._monotonic()
        self._lease_seconds[q.name] = self._tried_seconds[q.name] = q.settings.visibility_timeout
        self._queues = [*self._queues, q]  # a new list: the thread may be iterating the old

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            send_reports(self._queues, self._in_flight)
            self.extend_due()
            if self._lingering and not any(self._in_flight(q.name) for q in self._queues):
                return

    def extend_due(self) -> None:
        """Extend every queue whose interval has passed since its last extension, or whose
        visibility timeout was raised since (its leases first, then its longer interval)."""
        for q in self._queues:
            seconds = q.settings.visibility_timeout  # read once: the loop may replace it
            now = self._monotonic()
            raised = seconds > self._tried_seconds[q.name]
            # The leases end as the timeout they were set with says, until Redis has new ones.
            lease = min(seconds, self._lease_seconds[q.name])
            if not raised and now - self._extended_at[q.name] < extend_interval(lease):
                continue
            self._extended_at[q.name] = now
            self._tried_seconds[q.name] = seconds
            messages = self._in_flight(q.name)
            if not messages:
                # Nothing to extend; the interval stays the old one's until something held
                # is extended with the new timeout (a claim replayed after a lost reply may
                # hold a lease set with the old one).
                continue
            try:
                q.extend(*messages, seconds=seconds)
            except Exception as e:  # Redis down, a broken key: the next interval tries again
                logger.warning(
                    "queue %s: could not extend %d deadline(s): %s", q.name, len(messages), e
                )
                continue
            self._lease_seconds[q.name] = seconds

    def linger(self, abandoned: Callable[[str], list[Message]]) -> None:
        """From now on extend only ``abandoned(queue name)`` (the messages of handlers still
        running when the consumer stopped), and end once it is empty for every queue. The
        thread is a daemon: a process that exits stops extending, and they come back after
        their visibility timeout; a process that lives on (``run()`` used as a library) never
        sees them delivered again beside their running handler."""
        self._in_flight = abandoned
        self._lingering = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._tick + 5)
