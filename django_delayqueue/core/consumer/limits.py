"""What a running handler may be told: its soft limit, its stop (time limit or abort).

A handler with something to be told runs as a :class:`Run`, registered in the consumer's
:class:`Runs` while it runs. The watchdog (:mod:`.watchdog`) reads them and acts; the handler's
own side reads whether its message was aborted (``message.aborted``, :func:`abort_requested`).

On a handler thread the Run is made only when needed (most queues have no limit, and aborts are
rare): each thread has a :class:`Slot`, reused for every message, that says what it runs and
whether it is inside the handler now. A message whose queue has a time limit gets its Run as it
starts; any other gets one only when an abort of it is learnt (:class:`.aborts.AbortPoller`) or a
limit is set on its queue while it runs (the watchdog): :meth:`Runs.adopt`, under the runs' lock,
only while the handler is inside its code. A handler's end takes the same lock, so no Run is made
for a handler that has returned.

A stop is an exception raised inside the handler's thread (``PyThreadState_SetAsyncExc``),
only while that thread is inside the handler: :meth:`Run.leave` (under the same lock) ends that
and clears an exception that was set but not raised yet, so none ever lands in the consumer's
own code after the handler returned. A handler driven by something else than a thread (a
coroutine on an event loop) gives its :class:`Run` a ``canceller`` instead, which the watchdog
calls with the exception class (the async runner cancels the coroutine); its Run is made as it
starts, and found through a context variable.
"""

from __future__ import annotations

import contextvars
import ctypes
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable
from threading import get_ident
from time import monotonic

from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.consumer.stopped import Settlement, StoppedHandler
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import _stop_reasons
from django_delayqueue.core.journal import GARBAGE, RETRY

logger = logging.getLogger(__name__)

Canceller = Callable[[type[BaseException]], None]

# The run of the handler this asyncio task (a coroutine's) runs now: a context variable. Handler
# threads find theirs through their Slot instead (no set and reset per message).
_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("dq_run", default=None)
# This thread's Slot, if it ran a handler (``_here.slot``).
_here = threading.local()
# Every consumer's runs (message.aborted read on another thread than its handler's).
_registries: weakref.WeakSet[Runs] = weakref.WeakSet()


def _run_here() -> Run | None:
    run = _current.get()
    if run is not None:
        return run
    slot: Slot | None = getattr(_here, "slot", None)
    return None if slot is None else slot.run


def abort_requested() -> bool:
    """Whether the message of the handler (or task) running here was aborted (``dq.abort``):
    turns true within about a second of the abort; False outside a handler."""
    run = _run_here()
    return run is not None and run.aborted


def stop_error() -> BaseException | None:
    """The error a handler running here ends with whatever it returns: ``Aborted`` once its
    message was aborted, ``TimeLimitExceeded`` once it was stopped at its time limit; else
    None. (A task's record says so: the Tasks runner raises it after the task returned.)"""
    run = _run_here()
    if run is None:
        return None
    from django_delayqueue.core.consumer.stopped import abort_reason
    from django_delayqueue.core.errors import Aborted, TimeLimitExceeded

    if run.abort_reason is not None:
        return Aborted(abort_reason(run.abort_reason))
    stop = run.stop
    if stop is None:
        return None
    return Aborted(stop.reason) if stop.settlement == "dead" else TimeLimitExceeded(stop.reason)


def handler_returned() -> None:
    """The user's code of the handler running here has ended (returned or raised): from now
    on no limit or stop is raised in this thread, so none lands in what the consumer does with
    the result (a task's record, closing connections) and fails a handler that returned."""
    run = _current.get()
    if run is not None:
        run.leave()
        return
    slot: Slot | None = getattr(_here, "slot", None)
    if slot is not None and slot.inside:
        slot.leave()


def current_run() -> Run | None:
    """The run of the handler running in this thread or asyncio task, if one was made."""
    return _run_here()


def aborted(message: Message) -> bool:
    """``message.aborted``: whether an abort of this delivery reached its consumer."""
    run = _current.get()
    if run is None:
        slot: Slot | None = getattr(_here, "slot", None)
        if slot is not None and slot.runs_message(message):
            # Its own handler asks: an abort learnt makes its Run (Runs.adopt).
            run = slot.run
            return run is not None and run.aborted
    if run is not None and run.matches(message):
        return run.aborted
    return any(r.aborted for runs in list(_registries) for r in runs.all() if r.matches(message))


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
    canceller: Canceller | None = None
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
        canceller: Canceller | None = None,
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
        if canceller is not None:
            self.canceller = canceller

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

    def send(self, exception: type[BaseException], reason: str) -> bool:
        """Raise ``exception`` in the handler (or cancel it), if it is still inside it."""
        with self._lock:
            if not self._inside:
                return False
            if self.canceller is not None:
                try:
                    self.canceller(exception)
                except Exception:
                    logger.exception("cancelling message %s failed", self.message.id)
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
        self.send(exception, reason)
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
            from django_delayqueue.core.consumer.stopped import abort_reason

            return dataclasses.replace(
                outcome,
                status=GARBAGE,
                delay=None,
                reason=abort_reason(self.abort_reason),
                error="Aborted",
                writes=None,
            )
        stop = self.stop
        if stop is None:
            return outcome
        status = GARBAGE if stop.settlement == "dead" else RETRY
        return dataclasses.replace(
            outcome,
            status=status,
            delay=None,
            reason=stop.reason,
            error="TimeLimitExceeded" if status == RETRY else "Aborted",
            writes=None,
        )

    def stopped_handler(self) -> StoppedHandler:
        """What the supervisor settles once this run's process is gone."""
        stop = self.stop
        assert stop is not None
        if self.abort_reason is not None and stop.settlement != "dead":
            from django_delayqueue.core.consumer.stopped import abort_reason

            return StoppedHandler.of(self.message, "dead", abort_reason(self.abort_reason))
        return StoppedHandler.of(self.message, stop.settlement, stop.reason)


class Slot:
    """A handler thread's place among its consumer's runs, reused for every message it runs:
    what it runs (``message``, since ``started_monotonic``), whether it is inside the handler's
    code now (``inside``), and the message's :class:`Run` once one was made (``run``).

    Its own thread writes all but ``run``, which is written only under the runs' lock (by
    :meth:`Runs.adopt` on another thread, or by its own thread for a watched message).

    Why a handler without a Run ends without taking the lock (the common case, so it costs
    next to nothing), yet no Run is ever made for a handler that has ended: its thread writes
    ``inside = False`` and then reads ``run``; :meth:`Runs.adopt` writes ``run`` and then reads
    ``inside`` (and ``message``), undoing its write unless the handler is still inside. Each
    thread's two steps are seen in their order by the other (the interpreter's lock orders
    them), so at least one of the two sees the other's write: the handler sees the Run (and
    leaves it under the lock, after ``adopt`` decided), or ``adopt`` sees it left and undoes.
    """

    __slots__ = (
        "ident",
        "inside",
        "lock",
        "logical_queue",
        "message",
        "run",
        "runs",
        "started_monotonic",
    )

    def __init__(self, runs: Runs, ident: int) -> None:
        self.runs = runs
        self.lock = runs.lock
        self.ident = ident
        self.message: Message | None = None
        self.logical_queue = ""
        self.started_monotonic = 0.0
        self.inside = False
        self.run: Run | None = None

    def enter(self, message: Message, logical_queue: str, watched: bool) -> None:
        """Its thread starts the handler of ``message``; with ``watched`` (its queue has a time
        limit) its Run is made now, else only if one is needed (:meth:`Runs.adopt`). End it
        with :meth:`exit`, from a ``finally`` (entered from inside its ``try``)."""
        self.logical_queue = logical_queue
        self.started_monotonic = started = monotonic()
        self.message = message  # after the two above: adopt() reads them once it sees this
        if not watched:
            self.inside = True  # last: adopt() checks the message once this is true
            return
        run = Run(
            message,
            logical_queue,
            None,
            self.lock,
            thread_ident=self.ident,
            started_monotonic=started,
        )
        with self.lock:
            self.run = run
            self.inside = True
        self.runs.register(run)  # last: the watchdog may stop it from now on

    def leave(self) -> None:
        """The handler's code ended (:func:`handler_returned`): no Run is made for it any
        more, and its Run, if it has one, raises nothing more in its thread."""
        while True:
            try:
                self.inside = False
                if self.run is None:
                    return  # and adopt() makes none from now on (see the class's docstring)
                with self.lock:
                    run = self.run  # again: adopt() may have undone its own
                    if run is not None:
                        run.left()
                return
            except BaseException:  # a stop landing here, late: its handler has ended anyway
                continue

    def exit(self) -> Run | None:
        """The handler ended (or never started): the slot is free again. Returns the message's
        Run if one was made (the outcome to record is ``run.settled(outcome)``)."""
        if not self.inside and self.run is None:
            return None  # left (handler_returned) without a Run: none is made any more
        self.leave()
        with self.lock:
            run, self.run = self.run, None
        if run is not None:
            self.runs.unregister(run)
        return run

    def runs_message(self, message: Message) -> bool:
        """Whether ``message`` is the delivery this slot runs (or ran last)."""
        m = self.message
        return m is not None and _same_delivery(m, self.logical_queue, message)


class Runs:
    """The runs of one consumer's handlers, and its handler threads' slots (thread-safe)."""

    def __init__(self, on_start: Callable[[Run], None] | None = None) -> None:
        self.lock = threading.Lock()  # the runs', and every run's (see Run)
        self._runs: dict[tuple[str, str], Run] = {}  # by (physical queue, token)
        # Handler threads' slots, by thread ident: replaced whole (read without the lock).
        self._slots: dict[int, Slot] = {}
        self._on_start = on_start
        _registries.add(self)

    # --- handler threads: a Run only when one is needed --------------------------------------

    def slot(self) -> Slot:
        """The calling thread's slot (made as it runs its first message)."""
        slot: Slot | None = getattr(_here, "slot", None)
        if slot is None or slot.runs is not self:
            ident = get_ident()
            slot = _here.slot = Slot(self, ident)
            alive = {t.ident for t in threading.enumerate()}
            with self.lock:  # without the slots of ended threads (whose idents may come again)
                slots = {i: s for i, s in self._slots.items() if i in alive and i != ident}
                slots[ident] = slot
                self._slots = slots
        return slot

    def adopt(self, slot: Slot, message: Message) -> Run | None:
        """The Run of ``message``, made now if ``slot``'s thread runs its handler without one
        (an abort of it was learnt, or a time limit set on its queue while it runs); None if
        its handler's code is over (or has not started yet)."""
        with self.lock:
            if slot.message is not message:
                return None
            run = slot.run
            if run is not None:
                return run if slot.inside else None
            run = slot.run = Run(
                message,
                slot.logical_queue,
                None,
                self.lock,
                thread_ident=slot.ident,
                started_monotonic=slot.started_monotonic,
            )
            # Written first, then inside read: see Slot's docstring.
            if not slot.inside or slot.message is not message:
                slot.run = None  # it has ended (or moved on): nothing to watch
                return None
            self.register(run)
            return run

    def unwatched(self) -> list[tuple[Slot, Message]]:
        """The handler threads inside a handler that has no Run, as (slot, message): read
        without the lock, so a handler may have ended since (:meth:`adopt` says)."""
        found = []
        for slot in list(self._slots.values()):
            message = slot.message  # before inside: adopt() checks it is still this message
            if slot.inside and slot.run is None and message is not None:
                found.append((slot, message))
        return found

    # --- runs made as their handler starts (coroutines) -----------------------------------------

    def begin(
        self, message: Message, logical_queue: str, canceller: Canceller | None = None
    ) -> tuple[Run, contextvars.Token[Run | None]]:
        """A run of ``message`` on the calling thread (or, with ``canceller``, the calling
        asyncio task), registered; end it with :meth:`end`."""
        run = Run(message, logical_queue, canceller, self.lock)
        return run, self.start(run)

    def start(self, run: Run) -> contextvars.Token[Run | None]:
        self.register(run)
        return _current.set(run)

    def register(self, run: Run) -> None:
        # No lock: one dict store is atomic, and tokens are unique per queue.
        self._runs[(run.message.queue, run.message.token)] = run
        if self._on_start is not None:
            self._on_start(run)

    def unregister(self, run: Run) -> None:
        self._runs.pop((run.message.queue, run.message.token), None)

    def end(self, run: Run, token: contextvars.Token[Run | None] | None = None) -> None:
        """The handler ended: nothing may be raised in its thread any more (see Run.leave,
        done here under the same lock); it leaves the runs."""
        key = (run.message.queue, run.message.token)
        while True:
            try:
                with self.lock:
                    run.left()
                    self._runs.pop(key, None)
                break
            except BaseException:  # a stop landing here, late: its handler has ended anyway
                continue
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:  # another context (an async runner's): nothing to restore
                _current.set(None)

    def all(self) -> list[Run]:
        return list(self._runs.values())  # one C call: atomic

    def get(self, queue: str, token: str) -> Run | None:
        return self._runs.get((queue, token))

    def __bool__(self) -> bool:
        return bool(self._runs)


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
