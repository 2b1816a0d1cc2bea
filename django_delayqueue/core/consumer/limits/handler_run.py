"""One handler's run, as its thread and the watchdog see it: the stop (time limit or abort)
sent to it, its soft limit, and the outcome to record whatever it did after a stop.

Made by :class:`.limits.runs.Runs` (see :mod:`.limits.runs` for when a handler has one). How a
run is told of its soft limit and its stop is the one difference between the kinds: a handler
thread's gets an exception raised in its thread (``PyThreadState_SetAsyncExc``), only while it is
inside the handler; any other run carries a :class:`Stopper` that does it (a coroutine's, made by
its runner: the soft limit raised on the event loop, the stop a cancel). The watchdog decides
when for both, in one place (:mod:`.limits.watchdog`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
from collections.abc import Callable
from threading import get_ident
from time import monotonic
from typing import Protocol

from django_delayqueue.core.consumer.limits.stopped import Settlement, StoppedHandler
from django_delayqueue.core.consumer.outcomes import Outcome, aborted_outcome
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import SoftTimeLimitExceeded, _stop_reasons
from django_delayqueue.core.journal import RETRY
from django_delayqueue.core.observability.log_fields import message_fields

logger = logging.getLogger(__name__)

Canceller = Callable[[type[BaseException]], None]


class Stopper(Protocol):
    """How a run that is not a handler thread's is told (on the watchdog's thread, under its
    run's lock: quick, never blocking), and how long its stop may take."""

    @property
    def stop_wait_seconds(self) -> float | None:
        """Seconds a stopped run may take to end before it counts as unstoppable (None: the
        watchdog's STOP_WAIT_SECONDS, a thread's)."""
        ...

    def soft_limit(self, reason: str) -> None:
        """Raise ``SoftTimeLimitExceeded(reason)`` where it runs."""
        ...

    def stop(self, exception: type[BaseException], settlement: Settlement, reason: str) -> None:
        """Stop it (``TimeLimitExceeded`` or ``Aborted``): its message becomes ``settlement``."""
        ...


class CancellerStop:
    """The :class:`Stopper` of a run watched through ``Consumer.handler_run(message,
    canceller)``: ``canceller(exception class)`` for its soft limit and its stop alike."""

    stop_wait_seconds: float | None = None

    def __init__(self, canceller: Canceller) -> None:
        self.canceller = canceller

    def soft_limit(self, reason: str) -> None:
        self.canceller(SoftTimeLimitExceeded)

    def stop(self, exception: type[BaseException], settlement: Settlement, reason: str) -> None:
        self.canceller(exception)


def _same_delivery(m: Message, logical_queue: str, message: Message) -> bool:
    """Whether ``message`` (as a handler sees it: on its logical queue, for a shard's) is the
    delivery ``m`` of a queue whose logical name is ``logical_queue``."""
    same = m.id == message.id and m.token == message.token
    return same and message.queue in (m.queue, logical_queue)


@dataclasses.dataclass(frozen=True)
class Stop:
    """A stop sent to a handler: what its message becomes, why, and when it was sent."""

    settlement: Settlement
    reason: str
    sent_at: float  # time.monotonic()


class Run:
    """One handler running one message, as its thread and the watchdog see it.

    ``lock`` orders stops against the handler's end (a consumer's runs share one: cheaper to
    make than one per message)."""

    # What only a stop or an abort changes (class defaults: a run costs little to make).
    stopper: Stopper | None = None  # None: a handler thread's (exceptions raised in it)
    _sent = False  # an exception was sent (leave() must clear one not raised yet)
    soft_sent = False
    stop: Stop | None = None
    abort_reason: str | None = None  # the abort's own reason, once learnt
    abort_seen_at: float | None = None
    unstoppable = False  # stopped, and still running: its process must go

    def __init__(
        self,
        message: Message,
        logical_queue: str,
        stopper: Stopper | None = None,
        lock: threading.Lock | None = None,
        *,
        thread_ident: int | None = None,
        started_monotonic: float | None = None,
    ) -> None:
        self.message = message
        self.logical_queue = logical_queue
        self.thread_ident = get_ident() if thread_ident is None else thread_ident
        self.started_monotonic = monotonic() if started_monotonic is None else started_monotonic
        self._lock = threading.Lock() if lock is None else lock
        self._inside = True  # in its handler: an exception sent now lands there
        if stopper is not None:
            self.stopper = stopper

    def matches(self, message: Message) -> bool:
        return _same_delivery(self.message, self.logical_queue, message)

    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    @property
    def inside(self) -> bool:
        return self._inside

    def learn_abort(self, reason: str, now: float) -> bool:
        """Note an abort of this delivery (from Redis); True the first time."""
        if self.abort_reason is not None:
            return False
        self.abort_seen_at = now
        self.abort_reason = reason
        return True

    @property
    def stop_wait_seconds(self) -> float | None:
        """How long its stop may take (None: the watchdog's, a thread's)."""
        stopper = self.stopper
        return None if stopper is None else stopper.stop_wait_seconds

    def send(
        self, exception: type[BaseException], reason: str, settlement: Settlement | None = None
    ) -> bool:
        """Raise ``exception`` in the handler (its soft limit; its stop, with ``settlement``),
        or have its stopper do it, if it is still inside it."""
        with self._lock:
            if not self._inside:
                return False
            stopper = self.stopper
            if stopper is not None:
                try:
                    if settlement is None:
                        stopper.soft_limit(reason)
                    else:
                        stopper.stop(exception, settlement, reason)
                except Exception:
                    logger.exception(
                        "telling message %s's handler of %s failed",
                        self.message.id,
                        exception.__name__,
                        extra=message_fields(self.message),
                    )
                return True
            _stop_reasons[self.thread_ident] = reason
            self._sent = True
            raise_in_thread(self.thread_ident, exception)
            return True

    def send_stop(
        self, settlement: Settlement, reason: str, exception: type[BaseException], now: float
    ) -> bool:
        """Stop the handler (at ``now``, the watchdog's clock): its message's outcome is
        ``settlement`` with ``reason``."""
        if self.stop is not None:
            return False
        self.stop = Stop(settlement, reason, now)
        self.send(exception, reason, settlement)
        return True

    def leave(self) -> None:
        """The handler returned (or raised): nothing may be raised in this thread any more.

        Robust to an exception sent just before, landing in here: tried again until done.
        """
        while True:
            try:
                with self._lock:
                    self.left()
                return
            except BaseException:  # a stop landing here, late: its handler has ended anyway
                continue

    def left(self) -> None:
        """:meth:`leave`, its lock held."""
        if self._inside:
            self._inside = False
            if self._sent:
                clear_in_thread(self.thread_ident)
                _stop_reasons.pop(self.thread_ident, None)

    def settled(self, outcome: Outcome) -> Outcome:
        """The outcome to record: an abort's (dead letters) or a stop's (retry) whatever the
        handler did after it; else what it did."""
        if self.abort_reason is not None:
            from django_delayqueue.core.consumer.limits.stopped import abort_reason

            return aborted_outcome(outcome, abort_reason(self.abort_reason))
        stop = self.stop
        if stop is None:
            return outcome
        if stop.settlement == "dead":
            return aborted_outcome(outcome, stop.reason)
        return dataclasses.replace(
            outcome,
            status=RETRY,
            delay=None,
            reason=stop.reason,
            error="TimeLimitExceeded",
            writes=None,
        )

    def stopped_handler(self) -> StoppedHandler:
        """What the supervisor settles once this run's process is gone."""
        stop = self.stop
        assert stop is not None
        if self.abort_reason is not None and stop.settlement != "dead":
            from django_delayqueue.core.consumer.limits.stopped import abort_reason

            return StoppedHandler.of(self.message, "dead", abort_reason(self.abort_reason))
        return StoppedHandler.of(self.message, stop.settlement, stop.reason)


def raise_in_thread(ident: int, exception: type[BaseException]) -> None:
    """Raise ``exception`` in thread ``ident`` at its next Python instruction (a thread blocked
    in C, a socket read say, gets it only once that call returns, if ever)."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exception)
    )
    if done > 1:  # never for a valid id: undo, as the C API asks
        clear_in_thread(ident)


def clear_in_thread(ident: int) -> None:
    """Drop an exception sent to thread ``ident`` and not raised yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
