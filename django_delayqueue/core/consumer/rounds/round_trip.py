"""The consumer's round trip: a pipeline per Redis server that records, promotes and claims.

Queues may live on different Redis servers (or cluster nodes): each client gets its own
pipeline with its own queues' calls, in the order :meth:`RoundTrip.run` writes out. A queue
whose scripts fail is logged and left alone for a while; it never stops the others. Besides
the promotes and claims, two parts ride on every round trip through one interface
(:mod:`.rounds.parts`): the outcomes to record and the recurring schedules' keeper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.consumer.rounds.claims import ClaimReceipts
from django_delayqueue.core.consumer.rounds.flow_holds import (
    FlowHolds,
    wake_after,
    wake_for_freed_slots,
)
from django_delayqueue.core.consumer.rounds.left_at_stop import record_left
from django_delayqueue.core.consumer.rounds.parts import Keeper
from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, Message
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptBatch, is_out_of_memory, redis_errors
from django_delayqueue.core.scripts.contracts import HEARTBEAT

logger = logging.getLogger(__name__)

QUEUE_ERROR_PAUSE_MS = 5000  # how long a queue whose scripts fail is left alone
SERVER_DOWN_PAUSE_MS = 1000  # how long the queues of an unreachable server are left alone
HEARTBEAT_PRUNE_MS = 3_600_000
HEARTBEAT_FORGET_MS = 86_400_000  # consumers silent this long leave the heartbeats zset

Plan = list[tuple[Queue, str, int]]


class Round(NamedTuple):
    """What one round trip brought back."""

    claimed: list[Message]
    reap_again: bool  # a reap left timed-out deliveries behind: reap again next round


class RoundTrip:
    """The consumer's round trips to Redis, and what they last told about each queue."""

    def __init__(
        self,
        queues: Sequence[Queue],
        outcomes: UnrecordedOutcomes,
        keeper: Keeper,
        name: str,
        memory: OutOfMemoryLog,
        details: Callable[[Queue], str | None] | None = None,
        reads_format: int = ENVELOPE_FORMAT,
    ) -> None:
        self.clock = queues[0].clock
        # The newest envelope format this consumer reads: newer ones are left for another.
        self.reads_format = reads_format
        # What the heartbeat says about this consumer's process on a queue (rounds/details.py).
        self.details = details
        self.outcomes = outcomes
        self.keeper = keeper
        self.name = name  # the consumer's, in the heartbeats
        # Redis refusing writes for memory is logged once, not every round (shared with the
        # recording of outcomes and the recurring schedules).
        self.memory = memory
        self.claims = ClaimReceipts(reads_format)  # a claim whose reply was lost is asked for again
        self._clients: list[tuple[RedisClient, list[Queue]]] = []
        for q in queues:
            self.add_queue(q)
        self._heartbeats_pruned_at: dict[int, int] = {}  # per client
        self._next_wake: dict[str, int | None] = {}
        # Ready-list lengths seen by the last promote (less what the same round claimed): a
        # round that is only the idle safety poll claims only from queues with something to
        # claim, so an idle consumer costs Redis a few reads a second.
        self._ready_seen: dict[str, int] = {}
        self._claim_skipped: set[str] = set()
        self.holds = FlowHolds()  # queues a flow limit holds back (rounds/flow_holds.py)

    def add_queue(self, q: Queue) -> None:
        """Send ``q``'s calls with its server's pipeline from the next round."""
        group = next((g for client, g in self._clients if client is q.client), None)
        if group is None:
            self._clients.append((q.client, [q]))
        else:
            group.append(q)

    def run(
        self,
        now: int,
        claim_until: int,
        room: Mapping[str, int],
        budget: int | None = None,
        *,
        poll: bool = False,
        maintenance: bool = False,
    ) -> Round:
        """One round trip per Redis server. ``room``: how many messages each queue may claim
        (its handler threads say); ``budget``: how many in all (None: no limit); ``poll``: the
        round is only the idle safety poll; ``maintenance``: reap and heartbeat too.

        Promote and claim what is due by ``claim_until``; everything else uses ``now``.
        """
        self._claim_skipped = set()
        messages: list[Message] = []
        reap_again = False
        failures: list[DelayQueueError] = []
        down: list[str] = []  # the queues of the servers that failed
        for client, queues in self._clients:
            # The calls, in the order Redis runs them:
            batch = ScriptBatch()
            # 1. what finished since the last round: early writes, acks, nacks, the journal;
            recorded = self.outcomes.add_to(batch, queues, now)
            if recorded:  # a queue capped by max_in_flight: others may wait for these slots
                wake_for_freed_slots(batch, queues, recorded, now)
            # 2. recurring ticks, before the promotes: a tick created due is claimed by this round;
            ticks = self.keeper.add_to(batch, queues, now)
            # 3. per queue, promote and claim (and, at maintenance, reap).
            plan: Plan = []
            for q in queues:
                budget = self._plan_queue(batch, plan, q, claim_until, room, budget, poll)
                if maintenance:
                    plan.append((q, "reap", batch.add(q.reap_call(now))))
            # 4. at maintenance, the delivery timings counted since the last (core.timings).
            timed = self.outcomes.timings.add_to(batch, queues, now) if maintenance else []
            # The tasks' results this round took go beside this pipeline, Redis writing them
            # while this thread reads the round's reply (rounds/writes_ahead.py).
            self.outcomes.send_ahead(client)
            try:
                results = batch.run(client, raise_errors=False)
            except DelayQueueError as e:
                self.outcomes.timings.put_back(timed)
                # This server is down: its queues wait, the others' round goes on (and what
                # they claimed is delivered: raising here would strand it in unack). Its
                # claims may have run: the next round asks for them again by their ids.
                failures.append(e)
                self.claims.lost([q.name for q in queues])
                down.extend(q.name for q in queues)
                for q in queues:
                    self._next_wake[q.name] = now + SERVER_DOWN_PAUSE_MS
                    self._ready_seen[q.name] = 0
                continue
            # The replies: the outcomes, the claimed messages, then the keeper's (after the
            # claims, which must reach their handlers whatever a schedule's reply holds).
            self.outcomes.read(recorded, results, now)
            self.outcomes.timings.read(timed, results)
            claimed, reaped_all = self._read_queue_results(plan, results, now)
            reap_again = reap_again or not reaped_all
            self.keeper.read(ticks, results, now)
            messages.extend(claimed)
            if maintenance:  # last: it never delays a delivery, and its failure loses no claim
                self._heartbeat(client, queues, now)
        if failures and len(failures) == len(self._clients):
            raise failures[0]  # every server is down: the loop backs off
        if down:
            # Their outcomes too: a failure's journal row owed there would make the next round
            # due at once (journal_due), round after round against the down server (with
            # every server down the loop backs off instead).
            self.outcomes.pause(down, SERVER_DOWN_PAUSE_MS / 1000)
        for failure in failures:
            logger.warning("%s; its queues are tried again in %d ms", failure, SERVER_DOWN_PAUSE_MS)
        return Round(messages, reap_again)

    def record_only(self, now: int, *, force: bool = False) -> None:
        """Record finished outcomes without promoting or claiming (shutting down)."""
        failure: DelayQueueError | None = None
        for client, queues in self._clients:
            batch = ScriptBatch()
            recorded = self.outcomes.add_to(batch, queues, now, force=force)
            if not recorded:
                continue
            wake_for_freed_slots(batch, queues, recorded, now)  # as in a round: slots free up
            try:  # one server down must not keep the others' outcomes from being recorded
                results = batch.run(client, raise_errors=False)
            except DelayQueueError as e:
                failure = e
            else:
                self.outcomes.read(recorded, results, now)
        if failure is not None:
            raise failure

    @staticmethod
    def give_back(q: Queue, unstarted: list[Message]) -> bool:
        """Put messages claimed but never started back in ``q``'s ready list (no attempt used);
        False when Redis refused."""
        try:
            q.release(*unstarted)
        except DelayQueueError as e:  # they come back after their visibility timeout
            logger.warning(
                "queue %s: could not give back %d message(s): %s", q.name, len(unstarted), e
            )
            return False
        return True

    def replay_lost_claims(self) -> list[Message]:
        """At a stop: ask, replay only, for what the claims whose reply was lost took: their
        messages, nothing new, on those queues only, whatever else a round would hold back (a
        schedule's states to read first). Returns them, to be given back unstarted rather than
        left to time out."""
        now = self.clock.now_ms()
        messages: list[Message] = []
        for client, group in self._clients:
            queues = [q for q in group if self.claims.unseen(q.name)]
            if not queues:
                continue
            batch = ScriptBatch()
            for q in queues:
                batch.add(self.claims.call(q, now, 1, replay_only=True))
            try:
                results = batch.run(client, raise_errors=False)
            except DelayQueueError as e:  # still down: they come back after their timeout
                logger.warning("claims whose reply was lost not asked for again: %s", e)
                continue
            plan: Plan = [(q, "claim", index) for index, q in enumerate(queues)]
            claimed, _ = self._read_queue_results(plan, results, now)
            messages.extend(claimed)
        return messages

    def record_left(self, seconds: float, monotonic: Callable[[], float]) -> None:
        """Record what is left (shutting down), trying for ``seconds`` (see left_at_stop)."""
        record_left(
            self.outcomes,
            lambda: self.record_only(self.clock.now_ms(), force=True),
            seconds,
            monotonic,
        )
        self.outcomes.timings.flush_now(self._clients, self.clock.now_ms())

    def due_by(self, now: int) -> bool:
        """Whether something is known to be due on a queue by ``now`` (or its retry is), or
        a failure's journal row or the acks of written results wait for a round (see
        recording.py)."""
        if any(t is not None and t <= now for t in self._next_wake.values()):
            return True
        return self.outcomes.recording_due()

    def has_ready(self, q: Queue) -> bool:
        """Whether the last round saw messages in ``q``'s ready list that it did not claim
        (and no flow limit holds them back)."""
        return self._ready_seen.get(q.name, 0) > 0 and not self.holds.holds(q.name)

    def next_due(self) -> int | None:
        """The earliest due time (or retry time, or "now") known on any queue, or the time a
        recurring schedule needs its next tick."""
        times = [t for t in self._next_wake.values() if t is not None]
        if (due := self.keeper.next_due()) is not None:
            times.append(due)
        return min(times, default=None)

    def _plan_queue(
        self,
        batch: ScriptBatch,
        plan: Plan,
        q: Queue,
        claim_until: int,
        room: Mapping[str, int],
        budget: int | None,
        poll: bool,
    ) -> int | None:
        """Promote ``q`` and claim what its room (and ``budget``) allow; returns the budget
        left."""
        if self.keeper.holds(q, claim_until):
            return budget  # this round reads its schedule states; the next one (at once) claims
        plan.append((q, "promote", batch.add(q.promote_call(claim_until))))
        count = room.get(q.name, 0)
        if budget is not None:
            count = min(count, budget)
        if count <= 0:
            if self.claims.unseen(q.name):  # its messages, nothing new (given back if stopping)
                replay = self.claims.call(q, claim_until, 1, replay_only=True)
                plan.append((q, "claim", batch.add(replay)))
            return budget
        if poll and self._nothing_to_claim(q, claim_until) and not self.claims.unseen(q.name):
            self._claim_skipped.add(q.name)
            return budget
        plan.append((q, "claim", batch.add(self.claims.call(q, claim_until, count))))
        return None if budget is None else budget - count

    def _nothing_to_claim(self, q: Queue, now: int) -> bool:
        """On a safety poll, a queue last seen with an empty ready list and nothing due.

        Every other path into ready announces itself on the wake channel (schedule of a due
        message, requeue, run now) or is seen by the promote of this round (see
        _read_queue_results), so skipping the claim here delays nothing.
        """
        due = self._next_wake.get(q.name)
        return self._ready_seen.get(q.name, 1) == 0 and (due is None or due > now)

    def _read_queue_results(
        self, plan: Plan, results: list[Any], now: int
    ) -> tuple[list[Message], bool]:
        """The claimed messages, and whether every reap reaped all it found."""
        messages: list[Message] = []
        reaped_all = True
        for q, kind, index in plan:
            raw = results[index]
            if isinstance(raw, Exception):
                # A broken queue (e.g. a key of the wrong type) must not stop the others or
                # make the loop spin: log it and look at that queue again a little later.
                if not self.memory.check(raw, f"queue {q.name}: {kind}"):
                    logger.error("queue %s: %s.lua failed: %s", q.name, kind, raw)
                if kind == "claim":  # it changed nothing (claim.lua reads before it writes)
                    self.claims.answered(q.name)
                if kind == "reap":  # promote and claim worked: keep what they told
                    continue
                self._next_wake[q.name] = now + QUEUE_ERROR_PAUSE_MS
                self._ready_seen[q.name] = 0
                continue
            if kind == "promote":
                promoted = q.promote_result(raw)
                if promoted.moved:
                    self.holds.promoted(q.name)
                self._ready_seen[q.name] = promoted.ready
                # Something reached ready without an announcement (say, released by a
                # consumer shutting down) while this round skipped the claim: claim next round.
                late = promoted.ready > 0 and q.name in self._claim_skipped
                self._next_wake[q.name] = now if promoted.more or late else promoted.next_due_ms
            elif kind == "claim":
                self.claims.answered(q.name)
                left = self._ready_seen.get(q.name, 0) - len(raw) // 4
                self._ready_seen[q.name] = max(0, left)
                hold = q.claim_hold(raw)  # a flow limit's answer (claimed: their waits)
                if hold is not None or self.holds.holds(q.name):
                    self.holds.note(q.name, hold, self._next_wake)
                messages.extend(q.claimed(raw, now, self.reads_format))
            elif kind == "reap":
                reaped_all = self._log_reaped(q, raw) and reaped_all
        return messages, reaped_all

    @staticmethod
    def _log_reaped(q: Queue, raw: Any) -> bool:
        """Log what a reap found; returns whether it reaped all of it."""
        reaped = q.reap_result(raw)
        if reaped.retried or reaped.buried:
            logger.warning(
                "queue %s: %d delivery(ies) timed out (%d to retry, %d to garbage)",
                q.name,
                reaped.retried + reaped.buried,
                reaped.retried,
                reaped.buried,
            )
            wake_after(q, reaped.retried + reaped.buried)  # their slots of a cap are free
        return not reaped.more

    def _heartbeat(self, client: RedisClient, queues: Sequence[Queue], now: int) -> None:
        """Record that this consumer is alive (read by the health check), and what its process
        does (:mod:`.rounds.details`, in the same pipeline). A Redis out of memory refuses the plain
        ZADD: for those queues heartbeat.lua, whose first write is a removal, goes through (see
        lua/includes/memory.lua), so a consumer that goes on delivering on a full server does
        not look dead."""
        forget_before = now - HEARTBEAT_FORGET_MS
        try:
            pipe = client.pipeline(transaction=False)
            # Forget consumers silent for a day so the set stays small (hourly is plenty).
            prune = now - self._heartbeats_pruned_at.get(id(client), 0) > HEARTBEAT_PRUNE_MS
            for q in queues:
                pipe.zadd(q.keys.heartbeats, {self.name: now})
            for q in queues if prune else []:
                # The names first, for their details below (ZRANGEBYSCORE before the removal).
                pipe.zrangebyscore(q.keys.heartbeats, "-inf", forget_before)
                pipe.zremrangebyscore(q.keys.heartbeats, "-inf", forget_before)
            for q in queues if self.details is not None else []:
                text = self.details(q) if self.details is not None else None
                if text is not None:
                    pipe.hset(q.keys.consumer_details, self.name, text)
            with redis_errors("heartbeat"):
                replies = pipe.execute(raise_on_error=False)
            batch = ScriptBatch()
            for q, reply in zip(queues, replies, strict=False):
                # The one write of every maintenance round: with no journal and no recurring
                # schedule, the only way this consumer learns that Redis is full, or has room.
                if not isinstance(reply, Exception):
                    self.memory.taken()
                elif self.memory.check(reply, f"queue {q.name}: the heartbeat"):
                    call = HEARTBEAT.call(
                        q.keys, now_ms=now, forget_before_ms=forget_before, consumer=self.name
                    )
                    batch.add(call)
            batch.run(client)
            if prune:
                self._heartbeats_pruned_at[id(client)] = now
                self._forget_details(client, queues, replies[len(queues) :: 2])
            for reply in replies:
                if isinstance(reply, Exception) and not is_out_of_memory(reply):
                    logger.debug("heartbeat skipped: %s", reply)  # a key of the wrong type
        except Exception as e:  # down, or a heartbeats key of the wrong type
            logger.debug("heartbeat skipped: %s", e)

    @staticmethod
    def _forget_details(client: RedisClient, queues: Sequence[Queue], forgotten: list[Any]) -> None:
        """Drop the details of the consumers the prune forgot (killed, never said goodbye)."""
        pipe = client.pipeline(transaction=False)
        for q, names in zip(queues, forgotten, strict=False):
            if isinstance(names, list) and names:
                pipe.hdel(q.keys.consumer_details, *names)
        if len(pipe):
            pipe.execute(raise_on_error=False)

    def leave_heartbeats(self) -> None:
        """Say this consumer is gone, so health stops counting it alive as soon as it stops
        (not ``HEALTH_CONSUMER_SECONDS`` later). Best effort: Redis may be down."""
        for client, queues in self._clients:
            try:
                pipe = client.pipeline(transaction=False)
                for q in queues:
                    pipe.zrem(q.keys.heartbeats, self.name)
                    pipe.hdel(q.keys.consumer_details, self.name)
                with redis_errors("heartbeat"):
                    pipe.execute()
            except Exception as e:  # down, or a heartbeats key of the wrong type
                logger.debug("heartbeat not removed: %s", e)
