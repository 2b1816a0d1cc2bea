"""Running one claimed message: on a handler thread (:meth:`HandlerDelivery.deliver`) or on the
event loop (:meth:`HandlerDelivery.adeliver`), under its time limits and aborts.

Threads and coroutines are two ways to run a handler under one delivery, whose steps are these,
in this order, on both paths (each step is numbered where it is taken):

1. wait until due: a message claimed up to one claim lead early is held until it became due
   (``sleep_until_due``, or ``asleep_until_due`` awaited, until ``became_due_ms``);
2. watchdog: the delivery's :class:`~.limits.runs.Run`, which the one watchdog keeps, its time
   limits and aborts (a thread's only when its queue has a time limit or an abort comes,
   exceptions raised in it; a coroutine's always, told through its runner's stopper: its soft
   limit raised on the loop, its stop a cancel, its Run ended with the delivery);
3. span: the delivery span (``observability.tracing``; a flag read when tracing is off);
4. run: the consumer's handler (``around_handler``, or ``around_coroutine_handler`` awaited);
5. outcome: what a stop made of it (``Run.settled``: a time limit retries, an abort
   dead-letters, whatever the handler did after);
6. span end, with that outcome;
7. tick write: a recurring tick's run, sent with the next round (``Keeper.finished``).

Steps 5 to 7 are one method for both (:meth:`HandlerDelivery._ended`); 1, 2 and 4 come in a
thread's and a coroutine's form. Written out in each path rather than as a list of step
objects walked per message: this is the hot path, and each step costs a call only where it has
work (no Run without a limit or an abort, no span without tracing).

A part of :class:`.loop.Consumer`, given what it needs: what the handler threads and the
coroutines runner call, with no part in the loop's rounds.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from django_delayqueue.core.clock import Clock
from django_delayqueue.core.consumer.handlers.coroutines import HandlerCoroutines
from django_delayqueue.core.consumer.limits.runs import Canceller, CancellerStop, Run, Runs, Stopper
from django_delayqueue.core.consumer.limits.watchdog import Watchdog
from django_delayqueue.core.consumer.outcomes import (
    RETRY,
    Outcome,
    WhileRunning,
)
from django_delayqueue.core.consumer.rounds.parts import Keeper
from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
from django_delayqueue.core.consumer.rounds.waiter import (
    asleep_until_due,
    became_due_ms,
    sleep_until_due,
)
from django_delayqueue.core.consumer.start_marks import StartMarks
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.tracing import (
    Delivery as DeliverySpan,
)
from django_delayqueue.core.observability.tracing import (
    delivery_ended,
    delivery_left,
    delivery_started,
    outcome_name,
)
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptCall


class HandlerDelivery:
    """Runs claimed messages: the handler threads call :meth:`deliver`, the coroutines runner
    (:attr:`coroutines`, which it owns) :meth:`adeliver`; ``runs_async(message)`` tells which
    of the two a message takes.

    The handler is the consumer's: ``around_handler(message)`` and
    ``around_coroutine_handler(message)`` run it and return its outcome; ``runs_async``,
    ``may_run_async`` and ``handler_thread_exit`` are the consumer's hooks, passed on as they
    are to the threads and the coroutines runner (no call of theirs goes through here).
    ``queue_named`` is the consumer's own dict of its queues (it grows with ``add_queues``);
    ``write_soon(queue, call)`` sends a recurring tick's write with the next round.
    """

    def __init__(
        self,
        clock: Clock,
        queue_named: dict[str, Queue],
        runs: Runs,
        watchdog: Watchdog,
        keeper: Keeper,
        unrecorded: UnrecordedOutcomes,
        write_soon: Callable[[Queue, ScriptCall | WhileRunning], None],
        start_marks: StartMarks,
        *,
        around_handler: Callable[[Message], Outcome],
        around_coroutine_handler: Callable[[Message], Awaitable[Outcome]],
        runs_async: Callable[[Message], bool],
        may_run_async: Callable[[], bool],
        handler_thread_exit: Callable[[], None],
    ) -> None:
        self._clock = clock
        self._queue_named = queue_named
        self._runs = runs
        self._watchdog = watchdog
        self._keeper = keeper
        # Its timings date a delivery span as the histograms do (read per delivery: a bench
        # replaces them).
        self._unrecorded = unrecorded
        self._write_soon = write_soon
        # Cleared once a delivery is due, before anything of its run (see start_marks.py).
        self._started = start_marks.clear
        self._around_handler = around_handler
        self._around_coroutine_handler = around_coroutine_handler
        self.runs_async = runs_async
        self.may_run_async = may_run_async
        self.handler_thread_exit = handler_thread_exit
        # Coroutine handlers (async def) run on one event loop, counted with the threads; their
        # Runs are in the runs the watchdog keeps, as the threads' (ended by that runner).
        self.coroutines = HandlerCoroutines(self, runs)

    # --- coroutine handlers ---------------------------------------------------------------------

    async def adeliver(self, message: Message) -> Outcome:
        """Run one claimed message on the event loop (never raises but for a cancellation):
        the steps of :meth:`deliver`, each in its coroutine form."""
        # 1. Wait until due: claimed up to one claim lead early, as for a thread, it starts when
        # it became due (a retry at its retry time), awaited, never blocking: the loop runs the
        # others.
        await asleep_until_due(self._clock, became_due_ms(message))
        self._started(message)  # from here a kill of this process charges its attempt
        q = self._queue_named.get(message.queue)
        # 2. Watchdog: a Run, always: dq.abort reaches it (message.aborted, abort_requested()),
        # and the watchdog keeps its limits and its abort's grace as a thread's, telling it
        # through its runner (the soft limit raised on the loop, a stop cancels it). Its runner
        # ends it with the delivery: once every thread it started has ended, it may be later.
        stopper = self.coroutines.stopper(message)
        run, context = self._begin_run(message, q, stopper)
        runner_ends_it = stopper.attach(run)
        traced = None
        try:
            # 3. Span (None when tracing is off), current in this coroutine's context.
            traced = delivery_started(message, q, self._clock, self._unrecorded.timings)
            # 4. Run.
            outcome = await self._around_coroutine_handler(message)
        except BaseException:
            # Cancelled (a stop, its limit, an abort's end, the consumer's stop): no outcome
            # here, its runner settles it as its canceller said; its span ends as stopped.
            self._left(run, context, runner_ends_it)
            if traced is not None:
                delivery_ended(traced, "stopped", "cancelled")
            raise
        self._left(run, context, runner_ends_it)
        return self._ended(q, outcome, run, traced)  # 5, 6 and 7

    def _left(self, run: Run, context: contextvars.Token[Run | None], runner_ends_it: bool) -> None:
        """A coroutine's handler code is over: its Run ends now, or with its delivery (its
        runner ends it, once the threads it started have ended: the watchdog keeps it)."""
        if runner_ends_it:
            self._runs.no_longer_current(context)
        else:
            self._runs.end(run, context)

    # --- what handler threads call ----------------------------------------------------------------

    def deliver(self, message: Message) -> Outcome:
        """Run one claimed message on the calling handler thread (never raises)."""
        # 1. Wait until due: claimed up to one claim lead early (see rounds/waiter.py), the
        # handler still starts on time, when the message became due (a retry at its retry time,
        # not its first due time).
        sleep_until_due(self._clock, became_due_ms(message))
        self._started(message)  # from here a kill of this process charges its attempt
        q = self._queue_named.get(message.queue)
        slot = traced = None
        try:  # at once: a stop landing from here on still frees the slot (finally)
            # 2. Watchdog.
            if q is None:
                slot = self._runs.enter(message, message.queue, False)
            else:
                # A Run only for a queue with a time limit (the watchdog times it); any other
                # gets one only if an abort of it comes while it runs (see limits/runs.py).
                s = q.settings
                if s.time_limit or s.soft_time_limit:
                    slot = self._runs.enter(message, q.logical_name, True)
                    if slot.run is not None:
                        self._run_started(slot.run.started_monotonic, q)
                else:
                    slot = self._runs.enter(message, q.logical_name, False)
            # 3. Span (None when tracing is off), current on this thread meanwhile.
            traced = delivery_started(message, q, self._clock, self._unrecorded.timings)
            # 4. Run.
            outcome = self._around_handler(message)
        except BaseException as e:  # a stop that landed just after the handler returned
            now = self._clock.now_ms()
            outcome = Outcome(message, RETRY, now, now, None, f"handler stopped: {e!r}")
        finally:
            # From here nothing is raised in this thread (a stop inside enter(): its slot).
            run = (slot or self._runs.slot()).exit()
        return self._ended(q, outcome, run, traced)  # 5, 6 and 7

    def _ended(
        self, q: Queue | None, outcome: Outcome, run: Run | None, traced: DeliverySpan | None
    ) -> Outcome:
        """Steps 5 to 7 of a delivery, on both paths, once its handler has left its Run."""
        # 5. Outcome: what a stop made of it (a time limit retries, an abort dead-letters,
        # whatever the handler did after).
        if run is not None:
            outcome = run.settled(outcome)
        # 6. Span end, with what the delivery came to.
        if traced is not None:
            _end_span(traced, q, outcome, run)
        # 7. Tick write: a recurring tick's run, sent with the next round.
        if q is not None:
            write = self._keeper.finished(q, outcome)
            if write is not None:
                self._write_soon(q, write)
        return outcome

    @contextlib.contextmanager
    def handler_run(self, message: Message, canceller: Canceller | None = None) -> Iterator[Run]:
        """Watch a handler run by other means than a handler thread: its time limits and
        aborts apply, ``canceller(exception class)`` tells it of its soft limit and stops it
        (on the watchdog's thread), and ``run.settled(outcome)`` is the outcome to record once it
        ended (steps 2 and 5 of a delivery, for a caller's own runner; :meth:`adeliver` takes
        them without a context manager)."""
        stopper = None if canceller is None else CancellerStop(canceller)
        run, context = self._begin_run(message, self._queue_named.get(message.queue), stopper)
        try:
            yield run
        finally:
            self._runs.end(run, context)

    def _begin_run(
        self, message: Message, q: Queue | None, stopper: Stopper | None
    ) -> tuple[Run, contextvars.Token[Run | None]]:
        """A Run of ``message`` on the calling thread or task, registered, the watchdog told
        when its first limit is due; end it with ``Runs.end``."""
        logical = message.queue if q is None else q.logical_name
        run, context = self._runs.begin(message, logical, stopper)
        if q is not None and (q.settings.time_limit or q.settings.soft_time_limit):
            self._run_started(run.started_monotonic, q)
        return run, context

    def abort_reason_for(self, message: Message) -> str | None:
        """The reason ``message``'s running delivery was aborted with, once this consumer
        learnt it ("" for none given); None while it was not aborted (or does not run)."""
        run = self._runs.get(message.queue, message.token)
        return None if run is None else run.abort_reason

    # --- time limits -----------------------------------------------------------------------------

    def _run_started(self, started_monotonic: float, q: Queue) -> None:
        """A handler with a limit started: the watchdog must look by its first limit (it may
        be asleep till then)."""
        limits = [x for x in (q.settings.soft_time_limit, q.settings.time_limit) if x]
        self._watchdog.due_by(started_monotonic + min(limits))


def _end_span(
    traced: DeliverySpan, q: Queue | None, outcome: Outcome | None, run: Run | None
) -> None:
    """End a delivery span with what the delivery came to (no outcome: it was cancelled)."""
    stopped = outcome is None or (run is not None and (run.stop is not None or run.aborted))
    if outcome is None:
        delivery_ended(traced, "stopped", "cancelled")
        return
    m = outcome.message
    attempts = q.settings.max_attempts if q is not None else m.attempt + 1
    name = outcome_name(outcome.status, m.attempt, attempts, stopped)
    if name == "ack":
        delivery_ended(traced, name, outcome.reason)
    else:  # ended once its nack replied: an abort nack.lua finds first makes it "stopped"
        outcome.span = delivery_left(traced, name, outcome.reason)


def is_coroutine_function(target: Any) -> bool:
    """Whether calling ``target`` returns a coroutine: an ``async def`` function or method, a
    partial of one, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(target):
        return True
    # An instance whose __call__ is async def: looked up on its class, as a call does.
    return not inspect.isroutine(target) and any(
        inspect.iscoroutinefunction(vars(klass).get("__call__")) for klass in type(target).__mro__
    )
