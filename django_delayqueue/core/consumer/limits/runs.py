"""What a running handler may be told: its soft limit, its stop (time limit or abort).

A handler with something to be told runs as a :class:`Run`, registered in the consumer's
:class:`Runs` while it runs. The watchdog (:mod:`.limits.watchdog`) reads them and acts; the
handler's own side reads whether its message was aborted (``message.aborted``,
:func:`abort_requested`).

On a handler thread the Run is made only when needed (most queues have no limit, and aborts are
rare): each thread has a :class:`Slot`, reused for every message, that says what it runs and whether
it is inside the handler now. A message whose queue has a time limit gets its Run as it starts; any
other gets one only when an abort of it is learnt (:class:`.limits.aborts.AbortPoller`) or a limit
is set on its queue while it runs (the watchdog): :meth:`Runs.adopt`, under the runs' lock, only
while the handler is inside its code. A handler's end takes the same lock, so no Run is made for a
handler that has returned.

A stop is an exception raised inside the handler's thread (``PyThreadState_SetAsyncExc``),
only while that thread is inside the handler: :meth:`Run.leave` (under the same lock) ends that
and clears an exception that was set but not raised yet, so none ever lands in the consumer's
own code after the handler returned. A handler driven by something else than a thread (a
coroutine on an event loop) gives its :class:`Run` a :class:`Stopper` instead, which the watchdog
tells of its soft limit and its stop (a coroutine's runner raises the soft limit on the loop and
cancels it); its Run is made as it starts, found through a context variable, and ended by whoever
made it (a coroutine's by its runner, once every thread it started for the delivery has ended).
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from collections.abc import Callable
from threading import get_ident

# Run, Stop and the raising in a thread live in limits/handler_run.py; imported from here as before.
from django_delayqueue.core.consumer.limits.handler_run import (
    Canceller,
    CancellerStop,
    Run,
    Stop,
    Stopper,
    _same_delivery,
    clear_in_thread,
    raise_in_thread,
)
from django_delayqueue.core.consumer.limits.shared_slot import SharedSlot, shared_run, shared_slot
from django_delayqueue.core.envelope import Message

__all__ = [
    "Canceller",
    "CancellerStop",
    "Run",
    "Runs",
    "Slot",
    "Stop",
    "Stopper",
    "abort_requested",
    "aborted",
    "clear_in_thread",
    "current_run",
    "handler_returned",
    "raise_in_thread",
    "stop_error",
]

# The run of the handler this asyncio task (a coroutine's) runs now: a context variable. Handler
# threads find theirs through their Slot instead (no set and reset per message); code given a
# copy of a handler thread's context on another thread, through shared_slot (see .shared_slot).
_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("dq_run", default=None)


class _Here(threading.local):
    """What this thread is: ``slot``, if it ran a handler (a plain attribute read, no
    ``getattr`` with a default: this is read twice per message)."""

    slot: Slot | None = None


_here = _Here()


# Every consumer's runs (message.aborted read on another thread than its handler's).
_registries: weakref.WeakSet[Runs] = weakref.WeakSet()


def _run_here() -> Run | None:
    run = _current.get()
    if run is not None:
        return run
    slot = _here.slot
    if slot is not None:
        return slot.run
    return shared_run()


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
    from django_delayqueue.core.consumer.limits.stopped import abort_reason
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
    slot = _here.slot  # a handler thread's, first: the most common
    if slot is not None and slot.inside:
        # Slot.leave() without a call when no Run was made (nearly always): the same order,
        # inside written then run read (see Slot). Were a stop to land in these two lines,
        # the slot's exit() leaves its Run all the same.
        slot.inside = False
        if slot.run is not None:
            slot.leave()
        return
    run = _current.get()  # a coroutine's (or a thread's started with Runs.start)
    if run is not None:
        run.leave()


def current_run() -> Run | None:
    """The run of the handler running in this thread or asyncio task (or whose thread's context
    this one was copied from), if one was made."""
    return _run_here()


def aborted(message: Message) -> bool:
    """``message.aborted``: whether an abort of this delivery reached its consumer."""
    run = _current.get()
    if run is None:
        slot = _here.slot
        if slot is not None and slot.runs_message(message):
            # Its own handler asks: an abort learnt makes its Run (Runs.adopt).
            run = slot.run
            return run is not None and run.aborted
    if run is not None and run.matches(message):
        return run.aborted
    return any(r.aborted for runs in list(_registries) for r in runs.all() if r.matches(message))


class Slot:
    """A handler thread's place among its consumer's runs, reused for every message it runs:
    what it runs (``message``), whether it is inside the handler's code now (``inside``), and
    the message's :class:`Run` once one was made (``run``). Since when it runs is noted by the
    handler threads (``HandlerThreads.running``), once: whoever adopts a run passes it.

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
        "shared",
    )

    def __init__(self, runs: Runs, ident: int) -> None:
        self.runs = runs
        self.lock = runs.lock
        self.ident = ident
        self.message: Message | None = None
        self.logical_queue = ""
        self.inside = False
        self.run: Run | None = None
        # Read through a context copied from its thread (shared_run): a new SharedSlot is
        # due in that thread's context before its next message.
        self.shared = False

    def enter(self, message: Message, logical_queue: str, watched: bool) -> None:
        """Its thread starts the handler of ``message``; with ``watched`` (its queue has a time
        limit) its Run is made now, else only if one is needed (:meth:`Runs.adopt`). End it
        with :meth:`exit`, from a ``finally`` (entered from inside its ``try``)."""
        self.logical_queue = logical_queue
        self.message = message  # after the above: adopt() reads it once it sees this
        if not watched:
            self.inside = True  # last: adopt() checks the message once this is true
            return
        run = Run(
            message,
            logical_queue,
            None,
            self.lock,
            thread_ident=self.ident,
            started_monotonic=self.runs.monotonic(),
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
    """The runs of one consumer's handlers, and its handler threads' slots (thread-safe).

    ``monotonic`` times the runs it makes (their start), the watchdog's clock."""

    def __init__(
        self,
        on_start: Callable[[Run], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monotonic = monotonic
        self.lock = threading.Lock()  # the runs', and every run's (see Run)
        self._runs: dict[tuple[str, str], Run] = {}  # by (physical queue, token)
        # Handler threads' slots, by thread ident: replaced whole (read without the lock).
        self._slots: dict[int, Slot] = {}
        self._on_start = on_start
        _registries.add(self)

    # --- handler threads: a Run only when one is needed --------------------------------------

    def enter(self, message: Message, logical_queue: str, watched: bool) -> Slot:
        """The calling thread's slot, entered (:meth:`Slot.enter`). Call it inside the
        ``try`` whose ``finally`` exits the slot: ``self.slot().exit()`` if it raised."""
        slot = _here.slot
        if slot is None or slot.runs is not self or slot.shared:
            slot = self.slot()
        if watched:
            slot.enter(message, logical_queue, True)
            return slot
        # Slot.enter() without a call, for a message without a Run (nearly always).
        slot.logical_queue = logical_queue
        slot.message = message  # after the above: adopt() reads it once it sees this
        slot.inside = True  # last: adopt() checks the message once this is true
        return slot

    def slot(self) -> Slot:
        """The calling thread's slot (made as it runs its first message)."""
        slot = _here.slot
        if slot is None or slot.runs is not self:
            ident = get_ident()
            slot = _here.slot = Slot(self, ident)
            # Once per thread (not per message): contexts copied from this thread carry it.
            shared_slot.set(SharedSlot(slot))
            alive = {t.ident for t in threading.enumerate()}
            with self.lock:  # without the slots of ended threads (whose idents may come again)
                slots = {i: s for i, s in self._slots.items() if i in alive and i != ident}
                slots[ident] = slot
                self._slots = slots
        elif slot.shared:
            # Read through a copied context during its last message: copies made from now on
            # carry a new one, the old ones see no later message (their SharedSlot is pinned).
            slot.shared = False
            shared_slot.set(SharedSlot(slot))
        return slot

    def adopt(self, slot: Slot, message: Message, started_monotonic: float) -> Run | None:
        """The Run of ``message``, made now if ``slot``'s thread runs its handler without one
        (an abort of it was learnt, or a time limit set on its queue while it runs), timed from
        ``started_monotonic``; None if its handler's code is over (or has not started yet)."""
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
                started_monotonic=started_monotonic,
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
        self, message: Message, logical_queue: str, stopper: Stopper | None = None
    ) -> tuple[Run, contextvars.Token[Run | None]]:
        """A run of ``message`` on the calling thread (or, with ``stopper``, the calling
        asyncio task), registered; end it with :meth:`end`."""
        run = Run(message, logical_queue, stopper, self.lock, started_monotonic=self.monotonic())
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
            self.no_longer_current(token)

    @staticmethod
    def no_longer_current(token: contextvars.Token[Run | None]) -> None:
        """The run :meth:`start` made current (``token``) is no longer this context's: its
        handler's code is over, though its run may go on (a coroutine's, held by its runner
        until the threads it started have ended: the runner ends it)."""
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
