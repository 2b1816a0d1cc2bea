"""The consumer loop: promote, claim, dispatch, record; sleep until the next due time.

A continuous pipeline. One loop thread talks to Redis; each queue has its own handler threads
(:mod:`.handler_threads`), so a queue with slow handlers never holds up another. A message is
claimed as soon as a handler thread of its queue is free, and a finished handler nudges the
loop, which records its outcome with the next round trip (:mod:`.rounds`, which says what one
carries). With nothing due the loop waits on the queues' wake channels until the earliest due
time (:mod:`.waiter`), so it is on time to the millisecond without polling Redis while idle.
Its mixins: :mod:`.handler_delivery`, :mod:`.round_planning`, :mod:`.handler_stops`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django_delayqueue.core.clock import exact_now_ms
from django_delayqueue.core.consumer.aborts import AbortPoller
from django_delayqueue.core.consumer.details import heartbeat_details
from django_delayqueue.core.consumer.extender import Extender
from django_delayqueue.core.consumer.handler_contracts import RunningHandler
from django_delayqueue.core.consumer.handler_coroutines import HandlerCoroutines
from django_delayqueue.core.consumer.handler_delivery import HandlerDelivery
from django_delayqueue.core.consumer.handler_stops import HandlerStops
from django_delayqueue.core.consumer.limits import Run, Runs, handler_returned
from django_delayqueue.core.consumer.outcomes import Outcome, WhileRunning, run_handler
from django_delayqueue.core.consumer.recording import UnrecordedOutcomes
from django_delayqueue.core.consumer.round_parts import Keeper, NoKeeper
from django_delayqueue.core.consumer.round_planning import RoundPlanning
from django_delayqueue.core.consumer.rounds import RoundTrip
from django_delayqueue.core.consumer.stopped import StoppedHandler
from django_delayqueue.core.consumer.stopping import StopRequests
from django_delayqueue.core.consumer.threads_by_queue import ThreadsByQueue
from django_delayqueue.core.consumer.waiter import (
    Waiter,
    Wake,
)
from django_delayqueue.core.consumer.watchdog import Watchdog
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


class Consumer(HandlerDelivery, HandlerStops, RoundPlanning):
    """Delivers the due messages of ``queues`` to ``handler`` (or to :meth:`handle`).

    ``concurrency`` is the number of handler threads *per queue*; None uses each queue's
    ``settings.concurrency``, re-read when the settings change. ``keeper`` keeps recurring
    schedules (``core.recurring.ScheduleKeeper``); ``monotonic`` is the clock, in seconds,
    that times maintenance, the grace period and the shutdown (tests inject a manual one).
    ``reads_format``: the newest envelope format it reads (default: the newest this release
    knows); a message of a newer one is left for a consumer that reads it, never dead-lettered.
    An older one pins it to an earlier release's format (a drill of a mixed fleet). Announced
    with its heartbeat, so that producers and the checks know what the live consumers read.
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
        self.max_messages = max_messages
        self.grace_seconds = grace_seconds
        self.idle_seconds = idle_seconds
        self.maintenance_seconds = maintenance_seconds
        self.journal_maxlen = journal_maxlen
        self.name = name or f"consumer-{uuid.uuid4().hex[:8]}"
        # Looked up now, not as a default argument, so a test may patch time.monotonic.
        self._monotonic = monotonic or time.monotonic
        self.delivered = 0  # handlers finished
        self._claimed_total = 0  # claimed and not given back unstarted (for max_messages)
        # One "out of memory" log line for the whole consumer: outcomes, rounds and ticks.
        self.memory = OutOfMemoryLog(logger, self.name)
        self._unrecorded = UnrecordedOutcomes(self.queues, journal_maxlen, self.memory)
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
        self._next_maintenance = -math.inf
        self._extender: Extender | None = None  # while run() runs
        self._waiter = Waiter([], self.clock, lambda: self.stopping)
        for q in self.queues:  # one listener per Redis client
            self._waiter.add_channels(q.client, [q.keys.wake_channel])
        # Coroutine handlers (async def) run on one event loop, counted with the threads; their
        # time limits are kept by that runner (handler_coroutines.py), their aborts as below.
        self.coroutines = HandlerCoroutines(
            self, self._coroutines_unstoppable, abort_reason_of=self.abort_reason_for
        )
        self._threads = ThreadsByQueue(self, self._waiter, self.coroutines, self._monotonic)
        # Time limits and aborts (limits.py, watchdog.py, aborts.py): the runs of the handlers,
        # the watchdog that stops them, the thread that learns their aborts (while run() runs).
        self._runs = Runs()
        self._watchdog = Watchdog(
            self._runs,
            self._settings_of,
            self._unstoppable_found,
            running=self.running_handlers,
        )
        self._aborts: AbortPoller | None = None
        # Handlers that could not be stopped, for the loop's thread: runs of handler threads
        # (from the watchdog) and coroutines (from the coroutines' watcher).
        self._unstoppable: list[Run] = []
        self._unstoppable_coroutines: list[StoppedHandler] = []
        self._unstoppable_lock = threading.Lock()
        self.replaced_for: list[StoppedHandler] = []  # given to replacement_needed
        self._handler_is_async: tuple[Any, bool] | None = None  # (handler, whether async)
        # The wait that ended just before the next round (see _fetch), and whether that round
        # is only the idle safety poll (it claims only where something is known to be ready).
        self._aim: Wake | None = None
        self._polling = False

    # --- hooks for subclasses (the Django worker) ---------------------------------------------

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

    def heartbeat_details(self, queue: Queue) -> str | None:
        """What the heartbeat on ``queue`` says about this process (:mod:`.details`); None
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

    # --- what handlers and a subclass call -------------------------------------------------------

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
        aborts = self._aborts = AbortPoller(
            lambda: self._queue_named, self._runs, self._abort_learnt
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

    def _loop(self) -> None:
        failures = 0
        while not self._stop.at_once:
            self._replace_unstoppable()
            if self.stopping:
                self._release_unstarted()
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
                self._release_unstarted()  # what this round claimed (a lost claim's replay)
                # Wait only for what is left: a running handler nudges as it ends. With nothing
                # left, the top of the loop returns now (an idle here waited out a whole second
                # after the last outcome was recorded, with nothing left to nudge it).
                # (A failure's journal row, sent once its nack replied, goes at once too.)
                if self._busy() and not self._unrecorded.journal_due():
                    self._waiter.idle(min(1.0, self._stop.grace_left()))
                continue
            if self._due_now():
                continue
            if self.burst and not self._busy() and not self._round_trip.holds.waits_for_token():
                return  # (a rate limit's next token is due, not idle: see flow_holds.py)
            aim = self._waiter.wait(self._round_trip.next_due(), self._poll_at())
            self._aim = None if aim.nudged else aim
            # A nudge (a handler finished) or a safety poll says nothing about new messages:
            # the round after it claims only where something is known to be ready.
            self._polling = aim.nudged or (not aim.announced and not self._due_now(aim.due_ms))

    def step(self, now_ms: int | None = None) -> int:
        """One round, in this order: maintenance if due (refresh the settings, resize the
        threads), take the finished outcomes, one round trip (record them, promote, claim),
        hand the claimed messages to their threads. Returns the messages claimed."""
        self._start_threads()
        maintenance = self._monotonic() >= self._next_maintenance or self.refresh_wanted()
        if maintenance:
            self.refresh()
            for q in self.queues:
                self._threads[q.name].resize(self._thread_count(q))
            self._next_maintenance = self._monotonic() + self.maintenance_seconds
        finished = self._threads.take_finished()
        self.delivered += len(finished)
        self._unrecorded.extend(finished)
        aim = self._aim  # _fetch uses it up
        round_started = self._monotonic()
        messages = self._fetch(now_ms, maintenance=maintenance)
        self._threads.add(messages)
        # How long threads that asked for more waited: what they hold ahead covers that
        # (claim_ahead.py).
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

    def _busy(self) -> bool:
        return bool(self._unrecorded) or self._threads.busy

    def _in_flight(self, name: str) -> list[Message]:
        """What this consumer holds in unack: claimed, running, or finished and unrecorded."""
        return self._threads.in_flight(name) + self._unrecorded.unrecorded_messages(name)

    def _abandoned(self, name: str) -> list[Message]:
        """Left in flight at a stop while their handler still runs (see Extender.linger)."""
        threads = self._threads.get(name)
        return threads.abandoned() if threads is not None else []

    # --- shutdown ---------------------------------------------------------------------------------

    def _shutdown(self) -> int:
        """Give back what is left, record what finished; a forced stop gives it a short try."""
        self._threads.hold()  # first: a lost claim's messages must not start
        replayed = self._round_trip.replay_lost_claims()
        self._claimed_total += len(replayed)  # given back with the unstarted, just below
        self._threads.add(replayed)
        self._release_unstarted()
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
