"""What the handler threads and the consumer promise each other, apart from the threads.

What the threads are given: a :class:`Deliverer` (the consumer: runs a message), a
:class:`LoopWaker` (its waiter) and :class:`Coroutines` (where async handlers run). What they
report: a :class:`RunningHandler` per handler running now. Kept apart from
:mod:`.handlers.threads` so that the readers of running handlers (the watchdog, the heartbeat
details, the admin's health probe) and the consumer's types need none of the threads' machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.envelope import Message


@dataclass(frozen=True)
class RunningHandler:
    """A message whose handler runs now: since when (``time.monotonic()`` and the consumer's
    clock in ms), on which thread (``threading.get_ident()``)."""

    message: Message
    started_monotonic: float
    started_ms: int
    thread_ident: int
    # On the event loop (thread_ident is the loop's thread): stopped by cancelling it
    # (HandlerCoroutines.cancel), never by raising in its thread.
    coroutine: bool = False


class Deliverer(Protocol):
    """What the handler threads run (the consumer)."""

    def deliver(self, message: Message) -> Outcome:
        """Run ``message``'s handler on the calling handler thread (never raises)."""
        ...

    def handler_thread_exit(self) -> None:
        """Called on a handler thread as it ends."""
        ...

    def may_run_async(self) -> bool:
        """Whether any message may run on the event loop; False spares asking
        ``Coroutines.runs_async`` per claimed message."""
        ...


class LoopWaker(Protocol):
    """How the handler threads wake the consumer's loop (its waiter)."""

    def nudge(self) -> None:
        """End the loop's wait now: a round trip is worth it."""
        ...

    def remind(self, at_monotonic: float) -> None:
        """End the loop's wait at ``at_monotonic`` (``time.monotonic()``) at the latest."""
        ...


class Coroutines(Protocol):
    """Where coroutine handlers run (the consumer's HandlerCoroutines)."""

    def runs_async(self, message: Message) -> bool:
        """Whether ``message``'s handler is a coroutine (on the loop thread, at its claim)."""
        ...

    def start(self, message: Message, done: Callable[[Outcome], None]) -> int:
        """Run it on the event loop, ``done(outcome)`` at its end; returns the loop thread's
        ident."""
        ...
