"""Pushing out the visibility deadline of messages a consumer still holds.

Each queue is extended on its own schedule, a third of its *current* visibility timeout (so a
timeout lowered in the admin takes effect in a running consumer), through its own Redis client,
and a queue whose extend fails never keeps another queue's messages from being extended.

Each tick also sends the progress its handlers reported since the last one
(:mod:`.progress_reports`): the thread wakes every tick anyway, so a report waits at most a
tick, and a consumer whose handlers report nothing makes no call for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from django_delayqueue.core.consumer.progress_reports import send_reports
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)

# How often the thread looks whether a queue is due (costs no Redis call), and the longest a
# progress report waits to be sent.
TICK_SECONDS = 0.2
SHORTEST_INTERVAL_SECONDS = 0.2


def extend_interval(q: Queue) -> float:
    """Seconds between two extensions of ``q``'s messages: a third of its visibility timeout."""
    return max(SHORTEST_INTERVAL_SECONDS, q.settings.visibility_timeout / 3)


class Extender:
    """A thread that extends the deadlines of ``in_flight(queue name)`` for every queue."""

    def __init__(
        self,
        queues: Sequence[Queue],
        in_flight: Callable[[str], list[Message]],
        tick_seconds: float = TICK_SECONDS,
    ) -> None:
        self._queues = list(queues)
        self._in_flight = in_flight
        self._tick = tick_seconds
        started = time.monotonic()
        self._extended_at = {q.name: started for q in self._queues}
        self._stop = threading.Event()
        self._lingering = False  # extending only the abandoned, until none is left
        self._thread = threading.Thread(target=self._run, name="delayqueue-extender", daemon=True)
        self._thread.start()

    def add(self, q: Queue) -> None:
        """Extend ``q``'s messages too (a queue added to the running consumer)."""
        self._extended_at[q.name] = time.monotonic()
        self._queues = [*self._queues, q]  # a new list: the thread may be iterating the old

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            send_reports(self._queues, self._in_flight)
            self.extend_due()
            if self._lingering and not any(self._in_flight(q.name) for q in self._queues):
                return

    def extend_due(self) -> None:
        """Extend every queue whose interval has passed since its last extension."""
        for q in self._queues:
            now = time.monotonic()
            if now - self._extended_at[q.name] < extend_interval(q):
                continue
            self._extended_at[q.name] = now
            messages = self._in_flight(q.name)
            if not messages:
                continue
            try:
                q.extend(*messages)
            except Exception as e:  # Redis down, a broken key: the next interval tries again
                logger.warning(
                    "queue %s: could not extend %d deadline(s): %s", q.name, len(messages), e
                )

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
