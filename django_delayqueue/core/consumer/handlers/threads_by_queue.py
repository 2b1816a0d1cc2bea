"""Every queue's handler threads in one consumer, by queue name (:class:`ThreadsByQueue`).

The consumer's loop speaks to all of its queues' threads at once: hand claimed messages to
their queue's threads, take every finished outcome, hold them all at a stop, list what is in
flight or running. That fan-out over queues, and what a stop does with the handlers it gives
up on (:func:`_leave_in_flight`), is apart from :mod:`.handlers.threads`, which is one queue's
threads and their lock: each module keeps one job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence

from django_delayqueue.core.consumer.handlers.contracts import (
    Coroutines,
    Deliverer,
    LoopWaker,
    RunningHandler,
)
from django_delayqueue.core.consumer.handlers.threads import HandlerThreads
from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)


class ThreadsByQueue:
    """The handler threads of every queue of one consumer, by queue name."""

    def __init__(
        self,
        deliverer: Deliverer,
        waker: LoopWaker,
        coroutines: Coroutines | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deliverer = deliverer
        self._waker = waker
        self._coroutines = coroutines
        self._monotonic = monotonic  # the loop's clock, which times refills
        self._by_name: dict[str, HandlerThreads] = {}

    def __getitem__(self, name: str) -> HandlerThreads:
        return self._by_name[name]

    def __iter__(self) -> Iterator[HandlerThreads]:
        return iter(list(self._by_name.values()))

    def get(self, name: str) -> HandlerThreads | None:
        return self._by_name.get(name)

    def start(self, name: str, size: int) -> None:
        """Start ``size`` threads for queue ``name``, unless it has its threads already."""
        if name not in self._by_name:
            self._by_name[name] = HandlerThreads(
                name, size, self._deliverer, self._waker, self._coroutines, self._monotonic
            )

    def add(self, messages: Sequence[Message]) -> None:
        """Hand claimed messages to the threads of their queues."""
        by_queue: dict[str, list[Message]] = {}
        for m in messages:
            by_queue.setdefault(m.queue, []).append(m)
        for name, claimed in by_queue.items():
            self._by_name[name].add(claimed)

    def refilled(self, round_started: float | None) -> None:
        """Every queue's threads: the round that started at ``round_started`` handed over
        what it claimed (None: it failed). See :meth:`HandlerThreads.refilled`."""
        for threads in self:
            threads.refilled(round_started)

    def take_finished(self) -> list[Outcome]:
        return [o for threads in self for o in threads.take_finished()]

    def hold(self) -> None:
        """Start nothing more on any queue (what is added later waits, given back at a stop)."""
        for threads in self:
            threads.hold()

    def hold_and_take_unstarted(self, name: str) -> list[Message]:
        """Start nothing more for queue ``name``; returns what was claimed and not started."""
        threads = self._by_name[name]
        threads.hold()
        return threads.take_unstarted()

    def finished_and_abandoned(self, queues: Sequence[Queue]) -> list[Outcome]:
        """At the end of a stop: the outcomes still to record; the handlers still running are
        given up on (their messages stay in unack, extended while they run: Extender.linger)."""
        finished: list[Outcome] = []
        for q in queues:
            # One instant: a handler finishing now is either among the finished (recorded) or
            # abandoned with the running (left in flight), never dropped in between.
            done, running = self._by_name[q.name].finished_and_abandoned()
            finished.extend(done)
            if running:
                _leave_in_flight(q, running)
        return finished

    def in_flight(self, name: str) -> list[Message]:
        threads = self._by_name.get(name)
        return threads.in_flight() if threads is not None else []

    @property
    def busy(self) -> bool:
        return any(threads.busy for threads in self)

    def running(self) -> list[RunningHandler]:
        """Every queue's running handlers (for time limits, aborts and heartbeats)."""
        return [r for threads in self for r in threads.running()]

    def record_due_in(self) -> float | None:
        """Seconds until the oldest untaken outcome of any queue must be recorded, or None."""
        due = [d for threads in self if (d := threads.record_due_in()) is not None]
        return min(due, default=None)

    def close(self) -> None:
        for threads in self:
            threads.close()


def _leave_in_flight(q: Queue, running: list[Message]) -> None:
    # Handlers still running when we must stop (grace over, or a second request): given
    # back now, another consumer could start a message while its handler still runs here
    # (a library caller's process goes on; runqueue's lives on for its last writes). So
    # they stay in unack, extended while their handler runs (Extender.linger): the
    # visibility timeout brings them back (the attempt counts: they started) once it has
    # ended, or the process has. Their outcome, if they finish, is not recorded.
    logger.warning(
        "queue %s: %d message(s) still running left in flight, extended while they run: "
        "delivered again %ss after their handler (or this process) ends, never beside it",
        q.name,
        len(running),
        f"{q.settings.visibility_timeout:g}",
    )
