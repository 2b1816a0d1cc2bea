"""The consumer loop: promote, claim, dispatch, record; sleep until the next due time.

A continuous pipeline. One loop thread talks to Redis; each queue has its own handler slots
(:mod:`.slots`), so a queue with slow handlers never holds up another. A message is claimed as
soon as a slot of its queue is free, and a finished handler nudges the loop, which records its
outcome with the next round trip: one pipeline per Redis client per round, carrying the
outcomes finished since the last one (acks, nacks, journal), then per queue promote + claim
(+ reap and heartbeat now and then). With nothing due the loop waits on the queues' wake
channels until the earliest due time, so it is on time to the millisecond without polling
Redis while idle.
"""

from __future__ import annotations

import logging
import math
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django_delayqueue.core.clock import exact_now_ms
from django_delayqueue.core.consumer.extender import Extender
from django_delayqueue.core.consumer.handler_threads import HandlerThreads
from django_delayqueue.core.consumer.outcomes import Outcome, run_handler
from django_delayqueue.core.consumer.rounds import Rounds
from django_delayqueue.core.consumer.waiter import Waiter, sleep_until_due
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.queue import ANNOUNCE_WITHIN_MS, Queue
from django_delayqueue.core.recurring.keeper import ScheduleKeeper, record_tick_call, tick_run
from django_delayqueue.core.scripts.calls import ScriptCall

logger = logging.getLogger(__name__)

Handler = Callable[[Message], Any]
SUBSCRIBE_WAIT_SECONDS = 2.0  # how long run() waits to be subscribed before its first round
SHUTDOWN_FLUSH_SECONDS = 10.0  # how long a graceful stop keeps trying to record outcomes
FORCED_FLUSH_SECONDS = 1.0
FLUSH_RETRY_PAUSE_SECONDS = 0.2


class Consumer(Rounds):
    """Delivers the due messages of ``queues`` to ``handler`` (or to :meth:`handle`).

    ``concurrency`` is the number of handler slots *per queue*; None uses each queue's
    ``settings.concurrency``, re-read when the settings change.
    """

    announce_within_ms = ANNOUNCE_WITHIN_MS  # longest sleep without reading the pending heads

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
        keeper: ScheduleKeeper | None = None,
    ) -> None:
        if not queues:
            raise DelayQueueError("a consumer needs at least one queue")
        names = [q.name for q in queues]
        if len(set(names)) != len(names):
            raise DelayQueueError(f"a queue may be consumed once per consumer: {names}")
        super().__init__(list(queues), journal_maxlen)
        self.handler = handler
        self.concurrency = concurrency
        self.burst = burst
        self.max_messages = max_messages
        self.grace_seconds = grace_seconds
        self.idle_seconds = idle_seconds
        self.maintenance_seconds = maintenance_seconds
        self.name = name or f"consumer-{uuid.uuid4().hex[:8]}"
        self.keeper = keeper
        self.memory.who = self.name
        if keeper is not None:
            keeper.memory = self.memory  # one "out of memory" log line for the whole consumer
        self._queue_named = {q.name: q for q in self.queues}
        # Only counted by request_stop (a signal handler): no Event, whose set() would take a
        # lock that the main thread may hold in the very frame the signal interrupted.
        self._stop_requests = 0
        self._grace_deadline = math.inf  # set by the first
        self._extender: Extender | None = None  # while run() runs
        self._waiter = Waiter(
            [(client, [q.keys.wake_channel for q in group]) for client, group in self._clients],
            self.clock,
            lambda: self.stopping,
        )

    # --- hooks for subclasses (the Django worker) ---------------------------------------------

    def handle(self, message: Message) -> Any:
        """Deliver one message; return to acknowledge, raise to retry (see errors.Retry/Reject)."""
        if self.handler is None:
            raise NotImplementedError("pass handler= or override handle()")
        return self.handler(message)

    def refresh(self) -> None:
        """Called every ``maintenance_seconds``: a subclass reloads queue settings here."""

    def refresh_wanted(self) -> bool:
        """Whether :meth:`refresh` should run with the next round, before maintenance is due."""
        return False

    def handler_thread_exit(self) -> None:
        """Called on a handler thread as it ends: a subclass releases per-thread resources."""

    def write_soon(self, queue: Queue, call: ScriptCall) -> None:
        super().write_soon(queue, call)  # not at the next poll, seconds away: get_result reads it
        self._waiter.written_soon()

    def add_queues(self, queues: Sequence[Queue]) -> list[Queue]:
        added = super().add_queues(queues)
        for q in added:
            self._queue_named[q.name] = q
            self._waiter.add_channels(q.client, [q.keys.wake_channel])
            if self._extender is not None:
                self._extender.add(q)
        self._start_slots()
        return added

    def around_handler(self, message: Message) -> Outcome:
        return run_handler(self.handle, message, self.clock.now_ms())

    def _start_when_due(self, message: Message) -> Outcome:
        # Claimed up to one claim lead early (see waiter.py): the handler still starts on time.
        sleep_until_due(self.clock, message.due_ms)
        outcome = self.around_handler(message)
        if self.keeper is not None:
            self._record_tick(outcome)
        return outcome

    def _record_tick(self, outcome: Outcome) -> None:
        """A recurring schedule's tick ran: its last run and outcome go with the next round."""
        q = self._queue_named.get(outcome.message.queue)
        tick = (
            None
            if q is None or self.keeper is None
            else self.keeper.recurrence_of(q, outcome.message.id)
        )
        if q is None or tick is None:
            return
        status = outcome.journal_row(q.settings.max_attempts)[6]
        run = tick_run(tick[1], outcome.finished_ms, status, outcome.error)
        self.write_soon(q, record_tick_call(q, tick[0].name, run))

    # --- stopping -------------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop_requests > 0

    def request_stop(self) -> None:
        """First call: finish in-flight handlers and stop. Second call: stop at once.

        Safe from a signal handler: it only sets flags and wakes the loop without blocking
        (or, when another thread holds the waiter's lock, within a wait slice).
        """
        self._stop_requests += 1
        if self._stop_requests == 1:
            self._grace_deadline = time.monotonic() + self.grace_seconds
        self._waiter.nudge(blocking=False)
        if self._stop_requests == 1:
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
        self._start_slots()
        # Subscribed before the first round: an announcement between that round's promote
        # and the subscription would otherwise be missed until the next poll.
        self._waiter.wait_subscribed(SUBSCRIBE_WAIT_SECONDS)
        extender = self._extender = Extender(self.queues, self._in_flight)
        logger.info(
            "%s consuming %s",
            self.name,
            ", ".join(f"{q.name} ({self._slots[q.name].size} slot(s))" for q in self.queues),
        )
        try:
            self._loop()
            return self._shutdown()
        finally:
            if any(slots.abandoned() for slots in self._slots.values()):
                extender.linger(self._abandoned)  # until their handlers end
            else:
                extender.stop()
            self._waiter.close()
            for slots in self._slots.values():
                slots.close()

    def _loop(self) -> None:
        failures = 0
        while self._stop_requests < 2:
            if self.stopping:
                self._release_unstarted()
                if not self._busy():
                    return
                if time.monotonic() >= self._grace_deadline:
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
                    self._waiter.idle(
                        min(pause, self._grace_left()), until=lambda: self._stop_requests > 1
                    )
                else:
                    self._waiter.idle(pause, until=lambda: self.stopping)
                continue
            if self._limit_reached() and not self._busy():
                return
            if self.stopping:  # asked during this round, maybe: the top of the loop decides
                self._release_unstarted()  # what this round claimed (a lost claim's replay)
                # Wait only for what is left: a running handler nudges as it ends. With nothing
                # left, the top of the loop returns now (an idle here waited out a whole second
                # after the last outcome was recorded, with nothing left to nudge it).
                if self._busy():
                    self._waiter.idle(min(1.0, self._grace_left()))
                continue
            if self._due_now():
                continue
            if self.burst and not self._busy():
                return
            aim = self._waiter.wait(self._next_due(), self._poll_at())
            self._aim = None if aim.nudged else aim
            # A nudge (a handler finished) or a safety poll says nothing about new messages:
            # the round after it claims only where something is known to be ready.
            self._polling = aim.nudged or (not aim.announced and not self._due_now(aim.due_ms))

    def _grace_left(self) -> float:
        return max(0.0, self._grace_deadline - time.monotonic())

    def step(self, now_ms: int | None = None) -> int:
        """One round: record outcomes, promote, claim into the slots. Returns messages claimed."""
        self._start_slots()
        if time.monotonic() >= self._next_maintenance or self.refresh_wanted():
            self.refresh()
            for q in self.queues:
                self._slots[q.name].resize(self._slot_count(q))
            self._next_maintenance = time.monotonic() + self.maintenance_seconds
            maintenance = True
        else:
            maintenance = False
        for slots in self._slots.values():
            finished = slots.take_finished()
            self.delivered += len(finished)
            self._unrecorded.extend(finished)
        aim = self._aim  # _fetch uses it up
        by_queue: dict[str, list[Message]] = {}
        for m in self._fetch(now_ms, maintenance=maintenance):
            by_queue.setdefault(m.queue, []).append(m)
        for name, messages in by_queue.items():
            self._slots[name].add(messages)
        if aim is not None and aim.due_ms is not None:
            self._waiter.lead.observe(exact_now_ms(self.clock) - aim.planned_ms)
        return sum(len(messages) for messages in by_queue.values())

    def _room(self, q: Queue) -> int:
        slots = self._slots.get(q.name)
        count = q.settings.claim_batch
        if slots is not None:
            count = min(count, slots.room(q.settings.claim_batch))
        return count

    # --- slots ------------------------------------------------------------------------------------

    def _slot_count(self, q: Queue) -> int:
        return self.concurrency or q.settings.concurrency

    def _start_slots(self) -> None:
        for q in self.queues:
            if q.name not in self._slots:
                self._slots[q.name] = HandlerThreads(
                    q.name,
                    self._slot_count(q),
                    self._start_when_due,
                    self._waiter.nudge,
                    self.handler_thread_exit,
                    self._waiter.remind,
                )

    def _busy(self) -> bool:
        return bool(self._unrecorded) or any(s.busy for s in self._slots.values())

    def _in_flight(self, name: str) -> list[Message]:
        """What this consumer holds in unack: claimed, running, or finished and unrecorded."""
        slots = self._slots.get(name)
        held = slots.in_flight() if slots is not None else []
        return held + self._unrecorded.unrecorded_messages(name)

    def _abandoned(self, name: str) -> list[Message]:
        """Left in flight at a stop while their handler still runs (see Extender.linger)."""
        slots = self._slots.get(name)
        return slots.abandoned() if slots is not None else []

    def _release_unstarted(self) -> None:
        """Hold every slot and give back what was claimed but not started (no attempt used)."""
        for q in self.queues:
            slots = self._slots[q.name]
            slots.hold()
            unstarted = slots.take_unstarted()
            if not unstarted:
                continue
            self._claimed_total -= len(unstarted)
            try:
                q.release(*unstarted)
            except DelayQueueError as e:  # they come back after their visibility timeout
                logger.warning(
                    "queue %s: could not give back %d message(s): %s", q.name, len(unstarted), e
                )

    # --- shutdown ---------------------------------------------------------------------------------

    def _shutdown(self) -> int:
        """Give back what is left, record what finished; a forced stop gives it a short try."""
        for slots in self._slots.values():  # first: a lost claim's messages must not start
            slots.hold()
        self._give_back_lost_claims()
        self._release_unstarted()
        for q in self.queues:
            # One instant: a handler finishing now is either among the finished (recorded) or
            # abandoned with the running (left in flight), never dropped in between.
            finished, running = self._slots[q.name].finished_and_abandoned()
            self.delivered += len(finished)
            self._unrecorded.extend(finished)
            if running:
                self._leave_in_flight(q, running)
        seconds = FORCED_FLUSH_SECONDS if self._stop_requests > 1 else SHUTDOWN_FLUSH_SECONDS
        deadline = time.monotonic() + seconds
        while self._unrecorded and time.monotonic() < deadline:
            try:
                self._flush_only(force=True)
            except DelayQueueError as e:
                logger.warning("could not record outcomes on shutdown: %s", e)
            if self._unrecorded:
                time.sleep(FLUSH_RETRY_PAUSE_SECONDS)
        if self._unrecorded:
            logger.warning(
                "%d outcome(s) not recorded: those messages will be delivered again",
                len(self._unrecorded),
            )
        self._leave_heartbeats()
        logger.info("%s stopped after %d message(s)", self.name, self.delivered)
        return 0

    def _give_back_lost_claims(self) -> None:
        """Ask once more for what claims whose reply was lost took (a replay: nothing new), so
        that it is given back unstarted rather than left to time out (the slots are held)."""
        for m in self._replay_lost_claims():
            self._slots[m.queue].add([m])

    def _leave_in_flight(self, q: Queue, running: list[Message]) -> None:
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

    # --- waiting ---------------------------------------------------------------------------------

    def _limit_reached(self) -> bool:
        return self.max_messages is not None and self.delivered >= self.max_messages

    def _poll_at(self) -> int:
        """When to look again even if nothing is known to be due: a poll or maintenance."""
        # Never past the producers' announce horizon: a message due later than that is not
        # announced, and is found by reading the pending head at this poll.
        idle_ms = min(int(self.idle_seconds * 1000), self.announce_within_ms)
        # Rounded up: a wait that ended before the (monotonic) maintenance time would find
        # no maintenance due, and wait again for a fraction of a millisecond.
        maintenance_in = math.ceil(max(0.0, self._next_maintenance - time.monotonic()) * 1000)
        # An outcome that no round trip was worth waking for (a quick queue with messages
        # still claimed) is recorded within RECORD_WITHIN_SECONDS of its handler's end.
        record_in = min(
            (s.record_due_in() for s in self._slots.values()), default=None, key=_none_last
        )
        wait_ms = min(idle_ms, maintenance_in + 1)
        if record_in is not None:
            wait_ms = min(wait_ms, math.ceil(record_in * 1000))
        return self.clock.now_ms() + wait_ms


def _none_last(value: float | None) -> float:
    return math.inf if value is None else value
