"""The consumer loop: promote, claim, dispatch, record; sleep until the next due time.

A continuous pipeline. One loop thread talks to Redis; each queue has its own handler threads
(:mod:`.handlers.threads`), so a queue with slow handlers never holds up another. A message is
claimed as soon as a handler thread of its queue is free, and a finished handler nudges the loop,
which records its outcome with the next round trip (:mod:`.rounds.round_trip`, which says what one
carries). With nothing due the loop waits on the queues' wake channels until the earliest due time
(:mod:`.rounds.waiter`), so it is on time to the millisecond without polling Redis while idle. It
owns its parts and gets none by inheritance: the planner of its rounds (:mod:`.rounds.planning`),
the one delivery path the handler threads and coroutines take (:mod:`.delivery`), the hand-over of
handlers that could not be stopped (:mod:`.limits.unstoppable`), and those named above.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from django_delayqueue.core.clock import exact_now_ms
from django_delayqueue.core.consumer.delivery import HandlerDelivery, is_coroutine_function
from django_delayqueue.core.consumer.handlers.contracts import RunningHandler
from django_delayqueue.core.consumer.handlers.loop_liveness import LoopLiveness
from django_delayqueue.core.consumer.handlers.threads_by_queue import ThreadsByQueue
from django_delayqueue.core.consumer.limits.aborts import AbortPoller
from django_delayqueue.core.consumer.limits.extender import Extender
from django_delayqueue.core.consumer.limits.runs import Canceller, Run, Runs, handler_returned
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.core.consumer.limits.unstoppable import Unstoppable, log_unstoppable
from django_delayqueue.core.consumer.limits.watchdog import Watchdog
from django_delayqueue.core.consumer.outcomes import (
    Outcome,
    WhileRunning,
    run_coroutine_handler,
    run_handler,
)
from django_delayqueue.core.consumer.rounds.details import heartbeat_details
from django_delayqueue.core.consumer.rounds.parts import Keeper, NoKeeper
from django_delayqueue.core.consumer.rounds.planning import RoundPlanner
from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
from django_delayqueue.core.consumer.rounds.round_trip import RoundTrip
from django_delayqueue.core.consumer.rounds.waiter import Waiter
from django_delayqueue.core.consumer.rounds.writes_ahead import WritesAhead
from django_delayqueue.core.consumer.start_marks import NO_START_MARKS, StartMarks
from django_delayqueue.core.consumer.stopping import StopRequests
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, Message, validate_format
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, PayloadError
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.queue import ANNOUNCE_WITHIN_MS, Queue
from django_delayqueue.core.scripts.calls import ScriptCall

logger = logging.getLogger(__name__)

Handler = Callable[[Message], Any]
SUBSCRIBE_WAIT_SECONDS = 2.0  # how long run() waits to be subscribed before its first round
SHUTDOWN_FLUSH_SECONDS = 10.0  # how long a graceful stop keeps trying to record outcomes
FORCED_FLUSH_SECONDS = 1.0


class Consumer:
    """Delivers the due messages of ``queues`` to ``handler`` (or to :meth:`handle`).

    ``concurrency`` is the number of handler threads *per queue*; None uses each queue's
    ``settings.concurrency``, re-read when the settings change. ``keeper`` keeps recurring
    schedules (``core.recurring.ScheduleKeeper``); ``monotonic`` is the clock, in seconds,
    that times maintenance, the grace period and the shutdown (tests inject a manual one).
    ``reads_format``: the newest envelope format it reads (default: the newest this release
    knows); a message of a newer one is left for a consumer that reads it, never dead-lettered.
    An older one pins it to an earlier release's format (a drill of a mixed fleet). Announced
    with its heartbeat, so that producers and the checks know what the live consumers read.
    ``start_marks``: where it marks what it claimed and has not started (:mod:`.start_marks`:
    a supervised child's, which its supervisor reads once the process is gone); default none.
    """

    announce_within_ms = ANNOUNCE_WITHIN_MS  # longest sleep without reading the pending heads
    # After replacement_needed: stop at once (as on SIGTERM). A supervised child does not: it
    # serves on until its successor consumes, then the supervisor stops it (no gap).
    stops_when_replaced = True

    def __init__(
        self,
        queues: Sequence[Queue],
        handler: Handler | None = None,
        *,
        concurrency: int | None = None,
        burst: bool = False,
        max_messages: int | None = None,
        grace_seconds: float = 30.0,
        idle_seconds: float = 2.0,
        maintenance_seconds: float = 5.0,
        journal_maxlen: int = 100_000,
        name: str | None = None,
        keeper: Keeper | None = None,
        monotonic: Callable[[], float] | None = None,
        reads_format: int = ENVELOPE_FORMAT,
        start_marks: StartMarks | None = None,
    ) -> None:
        if not queues:
            raise DelayQueueError("a consumer needs at least one queue")
        try:
            self.reads_format = validate_format(reads_format, "reads_format")
        except PayloadError as e:
            raise ConfigurationError(str(e)) from None
        names = [q.name for q in queues]
        if len(set(names)) != len(names):
            raise DelayQueueError(f"a queue may be consumed once per consumer: {names}")
        self.queues = list(queues)
        self.clock = self.queues[0].clock
        self.handler = handler
        self.concurrency = concurrency
        self.burst = burst
        self.grace_seconds = grace_seconds
        self.idle_seconds = idle_seconds
        self.maintenance_seconds = maintenance_seconds
        self.journal_maxlen = journal_maxlen
        self.name = name or f"consumer-{uuid.uuid4().hex[:8]}"
        # Looked up now, not as a default argument, so a test may patch time.monotonic.
        self._monotonic = monotonic or time.monotonic
        self._marks = start_marks if start_marks is not None else NO_START_MARKS
        self.delivered = 0  # handlers finished
        # One "out of memory" log line for the whole consumer: outcomes, rounds and ticks.
        self.memory = OutOfMemoryLog(logger, self.name)
        # Tasks' results go beside the round trip (rounds/writes_ahead.py); its thread wakes
        # the loop for their acks (the waiter is made below: looked up when it wakes).
        self._unrecorded = UnrecordedOutcomes(
            self.queues,
            journal_maxlen,
            self.memory,
            retry_buried=self.task_retry_buried,
            writes_ahead=WritesAhead(wake=lambda: self._waiter.nudge()),
        )
        self.keeper: Keeper = keeper if keeper is not None else NoKeeper()
        self.keeper.memory = self.memory
        # Set by a supervised child (django_delayqueue.supervisor): its supervisor's name and
        # pid, shown with this consumer's heartbeat.
        self.supervisor: dict[str, Any] | None = None
        self._round_trip = RoundTrip(
            self.queues,
            self._unrecorded,
            self.keeper,
            self.name,
            self.memory,
            details=self.heartbeat_details,
            reads_format=self.reads_format,
        )
        self._queue_named = {q.name: q for q in self.queues}
        self._stop = StopRequests(self._monotonic)
        self._extender: Extender | None = None  # while run() runs
        self._waiter = Waiter([], self.clock, lambda: self.stopping)
        for q in self.queues:  # one listener per Redis client
            self._waiter.add_channels(q.client, [q.keys.wake_channel])
        # Handlers that could not be stopped (threads and coroutines), reported from the
        # watchdog's thread, taken by the loop's thread (_replace_unstoppable).
        self._unstoppable = Unstoppable(self._abandon, self._waiter.nudge)
        self.replaced_for: list[StoppedHandler] = []  # given to replacement_needed
        # Time limits and aborts (limits/runs.py, limits/watchdog.py, limits/aborts.py): the runs of
        # the handlers, threads' and coroutines', the one watchdog that keeps their limits and
        # stops them (and, at each look, asks the coroutines' event loop for a sign of life:
        # handlers/loop_liveness.py), the thread that learns their aborts (while run() runs).
        self._runs = Runs()
        loop_liveness = LoopLiveness(lambda: self.coroutines.watched())
        self._watchdog = Watchdog(
            self._runs,
            self._settings_of,
            self._unstoppable.run_found,
            running=self.running_handlers,
            also=loop_liveness.look,
        )
        self._aborts: AbortPoller | None = None
        self._handler_is_async: tuple[Any, bool] | None = None  # (handler, whether async)
        # The one delivery path, for the handler threads and the coroutines runner it owns.
        self._delivery = HandlerDelivery(
            self.clock,
            self._queue_named,
            self._runs,
            self._watchdog,
            self.keeper,
            self._unrecorded,
            self.write_soon,
            self._marks,
            around_handler=self.around_handler,
            around_coroutine_handler=self.around_coroutine_handler,
            runs_async=self.runs_async,
            may_run_async=self.may_run_async,
            handler_thread_exit=self.handler_thread_exit,
        )
        self.coroutines = self._delivery.coroutines
        self._threads = ThreadsByQueue(
            self._delivery, self._waiter, self.coroutines, self._monotonic
        )
        # What each round claims and when the next is due (rounds/planning.py).
        self._plan = RoundPlanner(
            self.queues,
            self.clock,
            self.keeper,
            self._round_trip,
            self._threads,
            self._stop,
            self._monotonic,
            max_messages,
            self._marks,
        )

    # --- hooks for subclasses (the Django worker) ---------------------------------------------
    # The delivery part is given around_handler, around_coroutine_handler, runs_async,
    # may_run_async and handler_thread_exit bound as the consumer is built: a subclass overrides
    # them (an attribute set on an instance later replaces none); handle and ahandle are read
    # at each call, through around_handler and around_coroutine_handler.

    def handle(self, message: Message) -> Any:
        """Deliver one message; return to acknowledge, raise to retry (see errors.Retry/Reject)."""
        if self.handler is None:
            raise NotImplementedError("pass handler= or override handle()")
        try:
            return self.handler(message)
        finally:
            handler_returned()  # no limit lands in what follows (see limits.handler_returned)

    def refresh(self) -> None:
        """Called every ``maintenance_seconds``: a subclass reloads queue settings here."""

    def refresh_wanted(self) -> bool:
        """Whether :meth:`refresh` should run with the next round, before maintenance is due."""
        return False

    def handler_thread_exit(self) -> None:
        """Called on a handler thread as it ends: a subclass releases per-thread resources."""

    def task_retry_buried(self, queue: Queue, message: Message, reason: str) -> None:
        """Called on the loop's thread when a task's delivery that failed with attempts left
        (its runner recorded a retry) was buried by its nack as aborted (``reason``: the dead
        letter's), once its record says FAILED, Aborted: a subclass that runs tasks tells
        that the task ended (Django's ``task_finished``)."""

    def heartbeat_details(self, queue: Queue) -> str | None:
        """What the heartbeat on ``queue`` says about this process (:mod:`.rounds.details`); None
        writes nothing."""
        return heartbeat_details(
            queue.name,
            self.delivered,
            self.running_handlers(),
            self.supervisor,
            reads_format=self.reads_format,
        )

    def around_handler(self, message: Message) -> Outcome:
        return run_handler(self.handle, message, self.clock.now_ms())

    def runs_async(self, message: Message) -> bool:
        """Whether ``message`` runs on the event loop (:meth:`ahandle`) rather than a thread
        (:meth:`handle`): here, when the handler (or an overridden ``handle``) is ``async def``.
        Asked on the loop's thread as the message is claimed: it must be quick."""
        return self._handler_async()

    def may_run_async(self) -> bool:
        """Whether any message may run on the event loop (asked per claimed batch, before
        :meth:`runs_async` per message): here, whether the handler is ``async def``; a
        subclass that tells per message (its own ``runs_async``) is asked per message."""
        if type(self).runs_async is not Consumer.runs_async:
            return True
        return self._handler_async()

    def _handler_async(self) -> bool:
        target = self.handler if self.handler is not None else self.handle
        cached = self._handler_is_async
        if cached is None or cached[0] is not target:  # asked once per handler, not per message
            cached = self._handler_is_async = (target, is_coroutine_function(target))
        return cached[1]

    async def ahandle(self, message: Message) -> Any:
        """Deliver one message on the event loop (what :meth:`handle` is for a thread)."""
        target = self.handler if self.handler is not None else self.handle
        return await target(message)

    async def around_coroutine_handler(self, message: Message) -> Outcome:
        return await run_coroutine_handler(self.ahandle, message, self.clock.now_ms())

    def replacement_needed(self, stopped: list[StoppedHandler]) -> None:
        """Called on the loop's thread when handlers could not be stopped (their threads did
        not end): this process must be replaced for them to stop. The consumer then stops as
        on SIGTERM, leaving ``stopped`` in flight. A supervised child tells its supervisor
        (which settles them once the process is gone); alone, they stay in flight as a stop
        leaves a running handler's message (extended while the handler runs)."""
        log_unstoppable(stopped)

    # --- what handlers and a subclass call -------------------------------------------------------

    def deliver(self, message: Message) -> Outcome:
        """Run one claimed message on the calling thread, as a handler thread does (never
        raises); the threads call the consumer's :class:`~.delivery.HandlerDelivery`."""
        return self._delivery.deliver(message)

    async def adeliver(self, message: Message) -> Outcome:
        """Run one claimed message on the calling event loop, as the coroutines runner does."""
        return await self._delivery.adeliver(message)

    def handler_run(
        self, message: Message, canceller: Canceller | None = None
    ) -> AbstractContextManager[Run]:
        """Watch a handler run by other means than a handler thread (see
        :meth:`.delivery.HandlerDelivery.handler_run`): its time limits and aborts apply,
        ``canceller(exception class)`` stops it."""
        return self._delivery.handler_run(message, canceller)

    def abort_reason_for(self, message: Message) -> str | None:
        """The reason ``message``'s running delivery was aborted with, once this consumer
        learnt it ("" for none given); None while it was not aborted (or does not run)."""
        return self._delivery.abort_reason_for(message)

    @property
    def max_messages(self) -> int | None:
        """How many messages this consumer delivers before it stops (None: no limit)."""
        return self._plan.max_messages

    def write_soon(self, queue: Queue, call: ScriptCall | WhileRunning) -> None:
        """Send ``call`` on ``queue`` with the next round trip, not waiting for it (thread-safe):
        a write a handler wants done without a round trip of its own (a task's RUNNING). It
        goes before any outcome's writes and acks of the same round, and the wait ends soon
        for it (not at the next poll, seconds away: get_result reads it)."""
        self._unrecorded.write_soon(queue.name, call)
        self._waiter.written_soon()

    def add_queues(self, queues: Sequence[Queue]) -> list[Queue]:
        """Consume ``queues`` too, from the next round (on the loop's thread, say from
        ``refresh``); returns those that were new."""
        added = [q for q in queues if q.name not in self._queue_named]
        for q in added:
            self.queues.append(q)
            self._queue_named[q.name] = q
            self._unrecorded.add_queue(q)
            self._round_trip.add_queue(q)
            self._waiter.add_channels(q.client, [q.keys.wake_channel])
            if self._extender is not None:
                self._extender.add(q)
        self._start_threads()
        return added

    # --- stopping -------------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.stopping

    def request_stop(self) -> None:
        """First call: finish in-flight handlers and stop. Second call: stop at once.

        Safe from a signal handler: it only sets flags and wakes the loop without blocking
        (or, when another thread holds the waiter's lock, within a wait slice).
        """
        count = self._stop.request(self.grace_seconds)
        self._waiter.nudge(blocking=False)
        if count == 1:
            logger.info("stopping: finishing in-flight handlers (send again to stop at once)")
        else:
            logger.warning("stopping at once; running messages stay in flight")

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask the loop to stop (from the main thread only)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.request_stop())

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, in burst mode, until nothing is due). Returns an exit code."""
        self._start_threads()
        # Subscribed before the first round: an announcement between that round's promote
        # and the subscription would otherwise be missed until the next poll.
        self._waiter.wait_subscribed(SUBSCRIBE_WAIT_SECONDS)
        extender = self._extender = Extender(self.queues, self._in_flight)
        self._watchdog.start()
        watchdog = self._watchdog
        aborts = self._aborts = AbortPoller(
            lambda: self._queue_named,
            self._runs,
            lambda run: watchdog.poke(),  # its grace starts
        ).start()
        self._waiter.on_abort = aborts.announced
        logger.info(
            "%s consuming %s",
            self.name,
            ", ".join(f"{q.name} (concurrency {self._threads[q.name].size})" for q in self.queues),
        )
        try:
            self._loop()
            code = self._shutdown()
            return 1 if self.replaced_for else code
        finally:
            aborts.stop()
            self._watchdog.stop()
            if any(threads.abandoned() for threads in self._threads):
                extender.linger(self._abandoned)  # until their handlers end
            else:
                extender.stop()
            self._waiter.close()
            self.coroutines.close()
            self._threads.close()
            self._unrecorded.close()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.at_once:
            self._replace_unstoppable()
            if self.stopping:
                self._plan.release_unstarted()
                if not self._busy():
                    return
                if self._stop.grace_left() <= 0:
                    logger.warning("grace period over: running messages stay in flight")
                    return
            try:
                self.step()
                failures = 0
            except Exception as e:  # Redis down, a broken refresh(): wait, never crash-loop
                failures += 1
                pause = min(10.0, 0.1 * 2 ** min(failures, 7))
                if isinstance(e, DelayQueueError):
                    logger.warning("%s; trying again in %.1fs", e, pause)
                else:
                    logger.exception("consumer step failed; trying again in %.1fs", pause)
                # A backoff that a handler's nudge does not cut short; a stop request does
                # (the first, or once stopping the second: the grace period bounds it too).
                if self.stopping:
                    left = min(pause, self._stop.grace_left())
                    self._waiter.idle(left, until=lambda: self._stop.at_once)
                else:
                    self._waiter.idle(pause, until=lambda: self.stopping)
                # What threads asked for meanwhile is not timed: a backoff is no refill's pace.
                self._threads.refilled(None)
                continue
            if self._limit_reached() and not self._busy():
                return
            if self.stopping:  # asked during this round, maybe: the top of the loop decides
                self._plan.release_unstarted()  # what this round claimed (a lost claim's replay)
                # Wait only for what is left: a running handler nudges as it ends. With nothing
                # left, the top of the loop returns now (an idle here waited out a whole second
                # after the last outcome was recorded, with nothing left to nudge it).
                # (A failure's journal row, sent once its nack replied, goes at once too.)
                if self._busy() and not self._unrecorded.recording_due():
                    self._waiter.idle(min(1.0, self._stop.grace_left()))
                continue
            if self._plan.due_now():
                continue
            if self.burst and not self._busy() and not self._round_trip.holds.waits_for_token():
                return  # (a rate limit's next token is due, not idle: see rounds/flow_holds.py)
            # Never past the producers' announce horizon: a message due later than that is not
            # announced, and is found by reading the pending head at this poll.
            idle_ms = min(int(self.idle_seconds * 1000), self.announce_within_ms)
            aim = self._waiter.wait(self._round_trip.next_due(), self._plan.poll_at(idle_ms))
            plan = self._plan
            plan.aim = None if aim.nudged else aim
            # A nudge (a handler finished) or a safety poll says nothing about new messages:
            # the round after it claims only where something is known to be ready.
            plan.polling = aim.nudged or (not aim.announced and not plan.due_now(aim.due_ms))

    def step(self, now_ms: int | None = None) -> int:
        """One round, in this order: maintenance if due (refresh the settings, resize the
        threads), take the finished outcomes, one round trip (record them, promote, claim),
        hand the claimed messages to their threads. Returns the messages claimed."""
        self._start_threads()
        plan = self._plan
        maintenance = plan.maintenance_due() or self.refresh_wanted()
        if maintenance:
            self.refresh()
            for q in self.queues:
                self._threads[q.name].resize(self._thread_count(q))
            plan.maintained(self.maintenance_seconds)
        finished = self._threads.take_finished()
        self.delivered += len(finished)
        self._unrecorded.extend(finished)
        aim = plan.aim  # fetch uses it up
        round_started = self._monotonic()
        messages = plan.fetch(now_ms, maintenance=maintenance)
        if messages:
            # Marked before any can start: a mark is cleared before its handler is called.
            self._marks.mark(messages)
            self._threads.add(messages)
        # How long threads that asked for more waited: what they hold ahead covers that
        # (rounds/claim_ahead.py).
        self._threads.refilled(round_started)
        if aim is not None and aim.due_ms is not None:
            self._waiter.lead.observe(exact_now_ms(self.clock) - aim.planned_ms)
        return len(messages)

    # --- handler threads --------------------------------------------------------------------------

    def _thread_count(self, q: Queue) -> int:
        return self.concurrency or q.settings.concurrency

    def _start_threads(self) -> None:
        for q in self.queues:
            self._threads.start(q.name, self._thread_count(q))

    def running_handlers(self) -> list[RunningHandler]:
        """The handlers running now, on every queue (thread-safe), since when on the consumer's
        clock (the shared one: the admin and the health probe compare it with Redis's time,
        whatever this host's wall clock says)."""
        running = self._threads.running()
        if not running:
            return running
        now_ms, now = self.clock.now_ms(), time.monotonic()
        return [
            dataclasses.replace(r, started_ms=now_ms - int((now - r.started_monotonic) * 1000))
            for r in running
        ]

    def _limit_reached(self) -> bool:
        return self.max_messages is not None and self.delivered >= self.max_messages

    def _busy(self) -> bool:
        return bool(self._unrecorded) or self._threads.busy

    def _in_flight(self, name: str) -> list[Message]:
        """What this consumer holds in unack: claimed, running, or finished and unrecorded."""
        return self._threads.in_flight(name) + self._unrecorded.unrecorded_messages(name)

    def _abandoned(self, name: str) -> list[Message]:
        """Left in flight at a stop while their handler still runs (see Extender.linger)."""
        threads = self._threads.get(name)
        return threads.abandoned() if threads is not None else []

    # --- handlers that could not be stopped ------------------------------------------------------

    def _settings_of(self, name: str) -> Any:
        q = self._queue_named.get(name)
        return None if q is None else q.settings

    def _abandon(self, message: Message) -> None:
        """On the watchdog's thread: give up on a handler thread's ``message`` (its outcome,
        should it come, is dropped; it stays in flight, extended while it runs)."""
        threads = self._threads.get(message.queue)
        if threads is not None:
            threads.abandon(message.token)

    def _replace_unstoppable(self) -> None:
        stopped = self._unstoppable.take()
        if not stopped:
            return
        self.replaced_for += stopped
        try:
            self.replacement_needed(stopped)
        except Exception:
            logger.exception("replacement_needed failed")
        if self.stops_when_replaced and not self.stopping:
            logger.warning("%s stops: a handler could not be stopped", self.name)
            self.request_stop()

    # --- shutdown ---------------------------------------------------------------------------------

    def _shutdown(self) -> int:
        """Give back what is left, record what finished; a forced stop gives it a short try."""
        self._threads.hold()  # first: a lost claim's messages must not start
        replayed = self._round_trip.replay_lost_claims()
        self._plan.claimed_total += len(replayed)  # given back with the unstarted, just below
        self._marks.mark(replayed)
        self._threads.add(replayed)
        self._plan.release_unstarted()
        finished = self._threads.finished_and_abandoned(self.queues)
        # Coroutines still running are cancelled (threads cannot be): given up on like the
        # threads' (left in flight), they end at their next await.
        self.coroutines.cancel_all("the consumer stops")
        self.delivered += len(finished)
        self._unrecorded.extend(finished)
        seconds = FORCED_FLUSH_SECONDS if self._stop.at_once else SHUTDOWN_FLUSH_SECONDS
        self._round_trip.record_left(seconds, self._monotonic)
        self._round_trip.leave_heartbeats()
        logger.info("%s stopped after %d message(s)", self.name, self.delivered)
        return 0
