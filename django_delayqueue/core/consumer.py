"""The consumer loop: promote, claim, dispatch, acknowledge; sleep until the next due time.

One loop thread talks to Redis; handlers run on a small pool of daemon threads. Each step
sends one pipeline per round: the outcomes of the previous batch (ack, nack, journal), then per
queue promote + claim (+ reap and heartbeat now and then). Between steps with nothing due the
loop waits on the queues' wake channel until the earliest due time, so it is on time to the
millisecond without polling Redis while idle.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .clock import exact_now_ms
from .envelope import Message
from .errors import DelayQueueError
from .outcome import Outcome, run_handler
from .pool import Batch, Extender, HandlerPool
from .queue import ANNOUNCE_WITHIN_MS, Queue
from .scripts import ScriptBatch, redis_errors
from .unrecorded import UnrecordedOutcomes
from .waiter import Waiter, Wake, sleep_until_due

logger = logging.getLogger(__name__)

Handler = Callable[[Message], Any]
QUEUE_ERROR_PAUSE_MS = 5000  # how long a queue whose scripts fail is left alone
# Claim the next batch while the handlers work on this one only if the last batch took less:
# then round trips are a real share of the time. With slower handlers they are not, and a
# batch waiting its turn would only keep its messages from other consumers.
PREFETCH_UNDER_SECONDS = 0.05
HEARTBEAT_PRUNE_MS = 3_600_000


class Consumer:
    """Delivers the due messages of ``queues`` to ``handler`` (or to :meth:`handle`)."""

    announce_within_ms = ANNOUNCE_WITHIN_MS  # longest sleep without reading the pending heads

    def __init__(
        self,
        queues: Sequence[Queue],
        handler: Handler | None = None,
        *,
        concurrency: int = 1,
        burst: bool = False,
        max_messages: int | None = None,
        grace_seconds: float = 30.0,
        idle_seconds: float = 2.0,
        maintenance_seconds: float = 5.0,
        journal_maxlen: int = 100_000,
        name: str | None = None,
    ) -> None:
        if not queues:
            raise DelayQueueError("a consumer needs at least one queue")
        self.queues = list(queues)
        self.client = self.queues[0].client
        self.clock = self.queues[0].clock
        self.handler = handler
        self.concurrency = max(1, concurrency)
        self.burst = burst
        self.max_messages = max_messages
        self.grace_seconds = grace_seconds
        self.idle_seconds = idle_seconds
        self.maintenance_seconds = maintenance_seconds
        self.journal_maxlen = journal_maxlen
        self.name = name or f"consumer-{uuid.uuid4().hex[:8]}"
        self.delivered = 0
        self._stop_requests = 0
        self._stop_event = threading.Event()
        self._unrecorded = UnrecordedOutcomes(self.queues, journal_maxlen)
        self._next_wake: dict[str, int | None] = {}
        # Ready-list lengths seen by the last promote (less what the same round claimed), and
        # whether the coming round is only the idle safety poll: such a round claims only from
        # queues with something to claim, so an idle consumer costs Redis a few reads a second.
        self._ready_seen: dict[str, int] = {}
        self._polling = False
        self._claim_skipped: set[str] = set()
        self._heartbeats_pruned_at = 0
        self._next_maintenance = 0.0
        self._waiter = Waiter(
            self.client,
            [q.keys.wake_channel for q in self.queues],
            self.clock,
            lambda: self.stopping,
            self._stop_event,
        )
        self._aim: Wake | None = None  # the wait that ended just before the next fetch
        self._pool: HandlerPool | None = None
        self._current: Batch | None = None
        self._prefetched: list[Message] = []
        self._prefetching = False  # only inside run(): a bare step() claims exactly once
        self._last_batch_seconds = float("inf")

    # --- hooks for subclasses (the Django worker) ---------------------------------------------

    def handle(self, message: Message) -> Any:
        """Deliver one message; return to acknowledge, raise to retry (see errors.Retry/Reject)."""
        if self.handler is None:
            raise NotImplementedError("pass handler= or override handle()")
        return self.handler(message)

    def refresh(self) -> None:
        """Called every ``maintenance_seconds``: a subclass reloads queue settings here."""

    def around_handler(self, message: Message) -> Outcome:
        return run_handler(self.handle, message, self.clock.now_ms())

    def _start_when_due(self, message: Message) -> Outcome:
        # Claimed up to one claim lead early (see waiter.py): the handler still starts on time.
        sleep_until_due(self.clock, message.due_ms, self._waiter.lead.cap_ms)
        return self.around_handler(message)

    # --- stopping -------------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop_requests > 0

    def request_stop(self) -> None:
        """First call: finish in-flight handlers and stop. Second call: stop at once."""
        self._stop_requests += 1
        self._stop_event.set()
        if self._stop_requests == 1:
            logger.info("stopping: finishing in-flight handlers (send again to stop at once)")
        else:
            logger.warning("stopping at once; unfinished messages come back after their timeout")

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask the loop to stop (from the main thread only)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.request_stop())

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, in burst mode, until nothing is due). Returns an exit code."""
        self._pool = HandlerPool(self.concurrency, self._start_when_due, lambda: self.stopping)
        self._prefetching = True
        extender = Extender(self._extend_interval(), self._in_flight, self._extend)
        failures = 0
        logger.info(
            "%s consuming %s with %d thread(s)",
            self.name,
            ", ".join(q.name for q in self.queues),
            self.concurrency,
        )
        try:
            while not self.stopping:
                try:
                    delivered = self.step()
                    failures = 0
                except Exception as e:  # Redis down, a broken refresh(): wait, never crash-loop
                    failures += 1
                    pause = min(10.0, 0.1 * 2 ** min(failures, 7))
                    if isinstance(e, DelayQueueError):
                        logger.warning("%s; trying again in %.1fs", e, pause)
                    else:
                        logger.exception("consumer step failed; trying again in %.1fs", pause)
                    self._waiter.close()
                    self._stop_event.wait(pause)
                    continue
                if self._limit_reached():
                    break
                if delivered == 0:
                    if self.burst and not self._due_now():
                        break
                    self._aim = self._waiter.wait(self._next_due(), self._poll_at())
                    self._polling = not self._aim.announced and not self._due_now(self._aim.due_ms)
            return self._shutdown()
        finally:
            self._prefetching = False
            extender.stop()
            self._waiter.close()

    def step(self, now_ms: int | None = None) -> int:
        """One round: flush outcomes, promote, claim and deliver. Returns messages delivered."""
        messages = self._prefetched or self._fetch(now_ms)
        self._prefetched = []
        if not messages:
            return 0
        self._deliver(messages)
        self.delivered += len(messages)
        return len(messages)

    def _fetch(self, now_ms: int | None = None) -> list[Message]:
        """One round trip: flush outcomes, promote, claim. Returns the claimed messages.

        After a wait that ended one claim lead early, it claims what is due by the time the
        wait aimed at; the handler threads hold those messages until they are due.
        """
        aim, self._aim = self._aim, None
        if now_ms is not None or aim is None or aim.due_ms is None:
            aim = None  # a step at a given time, or after a wait that was only a poll
        now = self.clock.now_ms() if now_ms is None else now_ms
        claim_until = now  # promote and claim what is due by then; everything else uses now
        if aim is not None and 0 < aim.due_ms - now <= self._waiter.lead.cap_ms:
            claim_until = aim.due_ms
        maintenance = time.monotonic() >= self._next_maintenance
        if maintenance:
            self.refresh()
            self._next_maintenance = time.monotonic() + self.maintenance_seconds
        batch = ScriptBatch()
        flush = self._unrecorded.add_to(batch, now)
        plan = self._add_queue_calls(batch, claim_until, now if maintenance else None)
        results = batch.run(self.client, raise_errors=False)
        if aim is not None:
            self._waiter.lead.observe(exact_now_ms(self.clock) - aim.planned_ms)
        self._unrecorded.settle(flush, results[: len(flush)])
        messages = self._read_queue_results(plan, results, now)
        if maintenance:  # last: it never delays a delivery, and its failure loses no claim
            self._heartbeat(now)
        return messages

    def _add_queue_calls(
        self, batch: ScriptBatch, claim_until: int, reap_at: int | None
    ) -> list[tuple[Queue, str, int]]:
        """Promote and claim what is due by ``claim_until``; reap too when ``reap_at`` is set."""
        plan = []
        room = self._room()
        self._claim_skipped = set()
        for q in self.queues:
            plan.append((q, "promote", batch.add(*q.promote_call(claim_until))))
            if not q.settings.paused and not self.stopping and room > 0:
                if self._nothing_to_claim(q, claim_until):
                    self._claim_skipped.add(q.name)
                else:
                    count = min(q.settings.claim_batch, room)
                    plan.append((q, "claim", batch.add(*q.claim_call(claim_until, count))))
            if reap_at is not None:
                plan.append((q, "reap", batch.add(*q.reap_call(reap_at))))
        self._polling = False
        return plan

    def _nothing_to_claim(self, q: Queue, now: int) -> bool:
        """On a safety poll, a queue last seen with an empty ready list and nothing due.

        Every other path into ready announces itself on the wake channel (schedule of a due
        message, requeue, run now) or is seen by the promote of this round (see
        _read_queue_results), so skipping the claim here delays nothing.
        """
        due = self._next_wake.get(q.name)
        return self._polling and self._ready_seen.get(q.name, 1) == 0 and (due is None or due > now)

    def _read_queue_results(
        self, plan: list[tuple[Queue, str, int]], results: list[Any], now: int
    ) -> list[Message]:
        messages: list[Message] = []
        for q, kind, index in plan:
            raw = results[index]
            if isinstance(raw, Exception):
                # A broken queue (e.g. a key of the wrong type) must not stop the others or
                # make the loop spin: log it and look at that queue again a little later.
                logger.error("queue %s: %s.lua failed: %s", q.name, kind, raw)
                self._next_wake[q.name] = now + QUEUE_ERROR_PAUSE_MS
                continue
            if kind == "promote":
                promoted = q.promote_result(raw)
                self._ready_seen[q.name] = promoted.ready
                # Something reached ready without an announcement (say, released by a
                # consumer shutting down) while this round skipped the claim: claim next round.
                late = promoted.ready > 0 and q.name in self._claim_skipped
                self._next_wake[q.name] = now if promoted.more or late else promoted.next_due_ms
            elif kind == "claim":
                left = self._ready_seen.get(q.name, 0) - len(raw) // 4
                self._ready_seen[q.name] = max(0, left)
                messages.extend(q.claimed(raw, now))
            elif kind == "reap":
                reaped = q.reap_result(raw)
                if reaped.retried or reaped.buried:
                    logger.warning(
                        "queue %s: %d delivery(ies) timed out (%d to retry, %d to garbage)",
                        q.name,
                        reaped.retried + reaped.buried,
                        reaped.retried,
                        reaped.buried,
                    )
                if reaped.more:
                    self._next_maintenance = 0.0
        return messages

    # --- delivering ----------------------------------------------------------------------------

    def _deliver(self, messages: list[Message]) -> None:
        assert self._pool is not None, "run() starts the handler pool"
        batch = Batch(messages)
        self._current = batch
        self._pool.submit(batch)
        started = time.monotonic()
        if self._prefetching and self._last_batch_seconds < PREFETCH_UNDER_SECONDS:
            self._prefetch()
        grace_deadline: float | None = None
        while not batch.done.wait(0.05):
            if self._stop_requests > 1:
                break
            if self.stopping:
                # Nothing more starts now: give the unstarted back at once (another consumer
                # may take them) and stop waiting as soon as the running handlers are done,
                # rather than at the end of the grace period.
                unstarted = batch.unstarted()
                if unstarted:
                    self._release(unstarted)
                if not batch.running():
                    break
                grace_deadline = grace_deadline or time.monotonic() + self.grace_seconds
                if time.monotonic() >= grace_deadline:
                    logger.warning("grace period over: giving back unfinished messages")
                    break
        self._current = None
        self._last_batch_seconds = time.monotonic() - started
        unstarted = batch.unstarted()
        if unstarted:
            self._release(unstarted)
        finished, running = batch.finished_and_running()
        self._unrecorded.extend(finished)
        if running:
            # Handlers still running when we must stop: they started, so the attempt counts;
            # hand them back for an immediate retry (if Redis is unreachable they stay in unack
            # and the visibility timeout brings them back).
            self._give_back(running)

    def _prefetch(self) -> None:
        """Claim the next batch now, so Redis works while the handlers do, not in turns."""
        try:
            self._prefetched = self._fetch()
        except Exception as e:  # the next step() meets the same problem and handles it
            logger.debug("prefetch failed: %s", e)

    def _release(self, messages: list[Message]) -> None:
        by_queue = self._group(messages)
        try:
            for q, group in by_queue:
                q.release(*group)
        except DelayQueueError as e:
            logger.warning("could not give back %d message(s): %s", len(messages), e)

    def _give_back(self, messages: list[Message]) -> None:
        reason = "consumer stopped before the handler finished"
        try:
            for q, group in self._group(messages):
                q.nack_many([(m, 0.0, reason) for m in group])
        except DelayQueueError as e:
            logger.warning("could not give back %d running message(s): %s", len(messages), e)

    def _in_flight(self) -> list[Message]:
        batch = self._current
        return (batch.in_flight() if batch else []) + self._prefetched

    def _extend(self, messages: list[Message]) -> None:
        for q, group in self._group(messages):
            q.extend(*group)

    def _extend_interval(self) -> float:
        shortest = min(q.settings.visibility_timeout for q in self.queues)
        return max(0.2, shortest / 3)

    # --- outcomes -------------------------------------------------------------------------------

    def _shutdown(self) -> int:
        """Flush what finished; a forced stop gives it a short try only."""
        if self._prefetched:  # claimed, never started: give them back without using an attempt
            self._release(self._prefetched)
            self._prefetched = []
        deadline = time.monotonic() + (1.0 if self._stop_requests > 1 else 10.0)
        while self._unrecorded and time.monotonic() < deadline:
            batch = ScriptBatch()
            flush = self._unrecorded.add_to(batch, self.clock.now_ms())
            try:
                self._unrecorded.settle(flush, batch.run(self.client, raise_errors=False))
            except DelayQueueError as e:
                logger.warning("could not record outcomes on shutdown: %s", e)
                time.sleep(0.2)
        if self._unrecorded:
            logger.warning(
                "%d outcome(s) not recorded: those messages will be delivered again",
                len(self._unrecorded),
            )
        logger.info("%s stopped after %d message(s)", self.name, self.delivered)
        return 0

    # --- waiting ---------------------------------------------------------------------------------

    def _room(self) -> int:
        if self.max_messages is None:
            return 1 << 30
        current = self._current.size if self._current else 0  # a prefetch claims beside it
        return max(0, self.max_messages - self.delivered - current)

    def _limit_reached(self) -> bool:
        return self.max_messages is not None and self.delivered >= self.max_messages

    def _due_now(self, now: int | None = None) -> bool:
        now = self.clock.now_ms() if now is None else now
        return any(t is not None and t <= now for t in self._next_wake.values())

    def _next_due(self) -> int | None:
        """The earliest due time (or retry time, or "now") known on any queue."""
        return min((t for t in self._next_wake.values() if t is not None), default=None)

    def _poll_at(self) -> int:
        """When to look again even if nothing is known to be due: a poll or maintenance."""
        # Never past the producers' announce horizon: a message due later than that is not
        # announced, and is found by reading the pending head at this poll.
        idle_ms = min(int(self.idle_seconds * 1000), self.announce_within_ms)
        # Rounded up: a wait that ended before the (monotonic) maintenance time would find
        # no maintenance due, and wait again for a fraction of a millisecond.
        maintenance_in = math.ceil(max(0.0, self._next_maintenance - time.monotonic()) * 1000)
        return self.clock.now_ms() + min(idle_ms, maintenance_in + 1)

    def _heartbeat(self, now: int) -> None:
        """Record that this consumer is alive (read by the health check)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            # Forget consumers silent for a day so the set stays small (hourly is plenty).
            prune = now - self._heartbeats_pruned_at > HEARTBEAT_PRUNE_MS
            for q in self.queues:
                pipe.zadd(q.keys.heartbeats, {self.name: now})
                if prune:
                    pipe.zremrangebyscore(q.keys.heartbeats, "-inf", now - 86_400_000)
            with redis_errors("heartbeat"):
                pipe.execute()
            if prune:
                self._heartbeats_pruned_at = now
        except DelayQueueError as e:  # down, or a heartbeats key of the wrong type
            logger.debug("heartbeat skipped: %s", e)

    def _group(self, messages: list[Message]) -> list[tuple[Queue, list[Message]]]:
        by_name = {q.name: q for q in self.queues}
        grouped: dict[str, list[Message]] = {}
        for m in messages:
            grouped.setdefault(m.queue, []).append(m)
        return [(by_name[name], group) for name, group in grouped.items()]
