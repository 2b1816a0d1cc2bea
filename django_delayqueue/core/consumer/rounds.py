"""One round of the consumer: a pipeline per Redis client that records, promotes and claims.

Queues may live on different Redis servers (or cluster nodes): each client gets its own
pipeline with its own queues' calls. A queue whose scripts fail is logged and left alone for a
while; it never stops the others.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock
from django_delayqueue.core.consumer.claims import ClaimReceipts
from django_delayqueue.core.consumer.handler_threads import HandlerThreads
from django_delayqueue.core.consumer.recording import UnrecordedOutcomes
from django_delayqueue.core.consumer.waiter import MAX_CLAIM_LEAD_MS, Wake
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.recurring.keeper import ScheduleKeeper
from django_delayqueue.core.scripts.calls import (
    ScriptBatch,
    ScriptCall,
    is_out_of_memory,
    redis_errors,
)
from django_delayqueue.core.scripts.contracts import HEARTBEAT

logger = logging.getLogger(__name__)

QUEUE_ERROR_PAUSE_MS = 5000  # how long a queue whose scripts fail is left alone
SERVER_DOWN_PAUSE_MS = 1000  # how long the queues of an unreachable server are left alone
HEARTBEAT_PRUNE_MS = 3_600_000
HEARTBEAT_FORGET_MS = 86_400_000  # consumers silent this long leave the heartbeats zset

Plan = list[tuple[Queue, str, int]]


class Rounds:
    """The Redis side of a consumer; :class:`~.consumer.Consumer` adds threads and waiting."""

    name: str
    max_messages: int | None

    def __init__(self, queues: list[Queue], journal_maxlen: int) -> None:
        self.queues = queues
        self.clock: Clock = queues[0].clock
        self.journal_maxlen = journal_maxlen
        self.delivered = 0  # handlers finished
        self._claimed_total = 0  # claimed and not given back unstarted (for max_messages)
        by_client: dict[int, tuple[Any, list[Queue]]] = {}
        for q in queues:
            by_client.setdefault(id(q.client), (q.client, []))[1].append(q)
        self._clients = list(by_client.values())
        self._slots: dict[str, HandlerThreads] = {}
        self._heartbeats_pruned_at: dict[int, int] = {}  # per client
        # Redis refusing writes for memory is logged once, not every round (shared with the
        # recording of outcomes and the recurring schedules).
        self.memory = OutOfMemoryLog(logger)
        self._unrecorded = UnrecordedOutcomes(queues, journal_maxlen, self.memory)
        self._claims = ClaimReceipts()  # a claim whose reply was lost is asked for again
        self._next_wake: dict[str, int | None] = {}
        # Ready-list lengths seen by the last promote (less what the same round claimed), and
        # whether the coming round is only the idle safety poll: such a round claims only from
        # queues with something to claim, so an idle consumer costs Redis a few reads a second.
        self._ready_seen: dict[str, int] = {}
        self._polling = False
        self._claim_skipped: set[str] = set()
        self._next_maintenance = 0.0
        self._aim: Wake | None = None  # the wait that ended just before the next fetch
        self.keeper: ScheduleKeeper | None = None  # recurring schedules this consumer keeps

    def write_soon(self, queue: Queue, call: ScriptCall) -> None:
        """Send ``call`` on ``queue`` with the next round trip, not waiting for it (thread-safe).

        For writes a handler wants done without a round trip of its own (a task's RUNNING);
        they go before any outcome's writes and acks of the same round.
        """
        self._unrecorded.write_soon(queue.name, call)

    def add_queues(self, queues: Sequence[Queue]) -> list[Queue]:
        """Consume ``queues`` too, from the next round (on the loop's thread, say from
        ``refresh``); returns those that were new."""
        added = []
        for q in queues:
            if any(q.name == known.name for known in self.queues):
                continue
            self.queues.append(q)
            group = next((g for client, g in self._clients if client is q.client), None)
            if group is None:
                self._clients.append((q.client, [q]))
            else:
                group.append(q)
            self._unrecorded.add_queue(q)
            added.append(q)
        return added

    def _room(self, q: Queue) -> int:
        """How many messages of ``q`` this round may claim (the consumer's slots say)."""
        return q.settings.claim_batch

    def _fetch(self, now_ms: int | None = None, *, maintenance: bool = False) -> list[Any]:
        """One round trip per client: record, promote, claim. Returns the claimed messages.

        After a wait that ended one claim lead early (``aim``), it claims what is due by the
        time the wait aimed at; the handler threads hold those messages until they are due.
        """
        aim, self._aim = self._aim, None  # an aim is used once
        now = self.clock.now_ms() if now_ms is None else now_ms
        claim_until = now  # promote and claim what is due by then; everything else uses now
        aimed = None if now_ms is not None or aim is None else aim.due_ms
        if aimed is not None and 0 < aimed - now <= MAX_CLAIM_LEAD_MS:
            claim_until = aimed
        room = None if self.max_messages is None else self.max_messages - self._claimed_total
        self._claim_skipped = set()
        messages: list[Any] = []
        failures: list[DelayQueueError] = []
        for client, queues in self._clients:
            batch = ScriptBatch()
            flush = self._unrecorded.add_to(batch, now, {q.name for q in queues})
            # Before the promotes: a tick created due (a catch-up) is claimed by this round.
            ticks = self.keeper.add_to(batch, queues, now) if self.keeper is not None else []
            plan: Plan = []
            for q in queues:
                room = self._plan_queue(batch, plan, q, claim_until, room)
                if maintenance:
                    plan.append((q, "reap", batch.add(q.reap_call(now))))
            try:
                results = batch.run(client, raise_errors=False)
            except DelayQueueError as e:
                # This server is down: its queues wait, the others' round goes on (and what
                # they claimed is delivered: raising here would strand it in unack). Its
                # claims may have run: the next round asks for them again by their ids.
                failures.append(e)
                self._claims.lost([q.name for q in queues])
                for q in queues:
                    self._next_wake[q.name] = now + SERVER_DOWN_PAUSE_MS
                    self._ready_seen[q.name] = 0
                continue
            self._unrecorded.settle(flush, results[: len(flush)])
            _confirm_acks(flush)
            claimed = self._read_queue_results(plan, results, now)
            if self.keeper is not None:  # after the claims, which must reach their handlers
                self.keeper.read(ticks, results, now)
            self._claimed_total += len(claimed)
            messages.extend(claimed)
            if maintenance:  # last: it never delays a delivery, and its failure loses no claim
                self._heartbeat(client, queues, now)
        self._polling = False
        if failures and len(failures) == len(self._clients):
            raise failures[0]  # every server is down: the loop backs off
        for failure in failures:
            logger.warning("%s; its queues are tried again in %d ms", failure, SERVER_DOWN_PAUSE_MS)
        return messages

    @property
    def stopping(self) -> bool:
        """Whether the loop is stopping (the loop class, which handles signals, says)."""
        raise NotImplementedError

    def _flush_only(self, force: bool = False) -> None:
        """Record finished outcomes without promoting or claiming (shutting down)."""
        now = self.clock.now_ms()
        failure: DelayQueueError | None = None
        for client, queues in self._clients:
            batch = ScriptBatch()
            flush = self._unrecorded.add_to(batch, now, {q.name for q in queues}, force=force)
            if not flush:
                continue
            try:  # one server down must not keep the others' outcomes from being recorded
                self._unrecorded.settle(flush, batch.run(client, raise_errors=False))
            except DelayQueueError as e:
                failure = e
            else:
                _confirm_acks(flush)
        if failure is not None:
            raise failure

    def _replay_lost_claims(self) -> list[Any]:
        """Ask, replay only, for what the claims whose reply was lost took (shutting down):
        their messages, nothing new, on those queues only, whatever else the round would hold
        back (a schedule's states to read first). Returns them, to be given back unstarted."""
        now = self.clock.now_ms()
        messages: list[Any] = []
        for client, group in self._clients:
            queues = [q for q in group if self._claims.unseen(q.name)]
            if not queues:
                continue
            batch = ScriptBatch()
            for q in queues:
                batch.add(self._claims.call(q, now, 1, replay_only=True))
            try:
                results = batch.run(client, raise_errors=False)
            except DelayQueueError as e:  # still down: they come back after their timeout
                logger.warning("claims whose reply was lost not asked for again: %s", e)
                continue
            plan: Plan = [(q, "claim", index) for index, q in enumerate(queues)]
            claimed = self._read_queue_results(plan, results, now)
            self._claimed_total += len(claimed)
            messages.extend(claimed)
        return messages

    def _plan_queue(
        self, batch: ScriptBatch, plan: Plan, q: Queue, claim_until: int, room: int | None
    ) -> int | None:
        """Promote ``q`` and claim what its slots (and ``room``) allow; returns room left."""
        if self.keeper is not None and self.keeper.holds(q, claim_until):
            return room  # this round reads its schedule states; the next one (at once) claims
        plan.append((q, "promote", batch.add(q.promote_call(claim_until))))
        count = 0
        if not (q.settings.paused or self.stopping or (room is not None and room <= 0)):
            count = self._room(q) if room is None else min(self._room(q), room)
        if count <= 0:
            if self._claims.unseen(q.name):  # its messages, nothing new (given back if stopping)
                replay = self._claims.call(q, claim_until, 1, replay_only=True)
                plan.append((q, "claim", batch.add(replay)))
            return room
        if self._nothing_to_claim(q, claim_until) and not self._claims.unseen(q.name):
            self._claim_skipped.add(q.name)
            return room
        plan.append((q, "claim", batch.add(self._claims.call(q, claim_until, count))))
        return None if room is None else room - count

    def _nothing_to_claim(self, q: Queue, now: int) -> bool:
        """On a safety poll, a queue last seen with an empty ready list and nothing due.

        Every other path into ready announces itself on the wake channel (schedule of a due
        message, requeue, run now) or is seen by the promote of this round (see
        _read_queue_results), so skipping the claim here delays nothing.
        """
        due = self._next_wake.get(q.name)
        return self._polling and self._ready_seen.get(q.name, 1) == 0 and (due is None or due > now)

    def _read_queue_results(self, plan: Plan, results: list[Any], now: int) -> list[Any]:
        messages: list[Any] = []
        for q, kind, index in plan:
            raw = results[index]
            if isinstance(raw, Exception):
                # A broken queue (e.g. a key of the wrong type) must not stop the others or
                # make the loop spin: log it and look at that queue again a little later.
                if not self.memory.check(raw, f"queue {q.name}: {kind}"):
                    logger.error("queue %s: %s.lua failed: %s", q.name, kind, raw)
                if kind == "claim":  # it changed nothing (claim.lua reads before it writes)
                    self._claims.answered(q.name)
                if kind == "reap":  # promote and claim worked: keep what they told
                    continue
                self._next_wake[q.name] = now + QUEUE_ERROR_PAUSE_MS
                self._ready_seen[q.name] = 0
                continue
            if kind == "promote":
                promoted = q.promote_result(raw)
                self._ready_seen[q.name] = promoted.ready
                # Something reached ready without an announcement (say, released by a
                # consumer shutting down) while this round skipped the claim: claim next round.
                late = promoted.ready > 0 and q.name in self._claim_skipped
                self._next_wake[q.name] = now if promoted.more or late else promoted.next_due_ms
            elif kind == "claim":
                self._claims.answered(q.name)
                left = self._ready_seen.get(q.name, 0) - len(raw) // 4
                self._ready_seen[q.name] = max(0, left)
                messages.extend(q.claimed(raw, now))
            elif kind == "reap":
                self._log_reaped(q, raw)
        return messages

    def _log_reaped(self, q: Queue, raw: Any) -> None:
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

    def _due_now(self, now: int | None = None) -> bool:
        """Whether the next round has work now: something due, or ready and a free slot."""
        now = self.clock.now_ms() if now is None else now
        if any(t is not None and t <= now for t in self._next_wake.values()):
            return True
        if self.keeper is not None and not self.stopping and self.keeper.needs_round(now):
            return True
        if self.stopping:
            return False
        return any(
            self._ready_seen.get(q.name, 0) > 0 and not q.settings.paused and self._room(q) > 0
            for q in self.queues
        ) and (self.max_messages is None or self._claimed_total < self.max_messages)

    def _next_due(self) -> int | None:
        """The earliest due time (or retry time, or "now") known on any queue, or the time a
        recurring schedule needs its next tick."""
        times = [t for t in self._next_wake.values() if t is not None]
        if self.keeper is not None and (due := self.keeper.next_due()) is not None:
            times.append(due)
        return min(times, default=None)

    def _heartbeat(self, client: RedisClient, queues: Sequence[Queue], now: int) -> None:
        """Record that this consumer is alive (read by the health check). A Redis out of memory
        refuses the plain ZADD: for those queues heartbeat.lua, whose first write is a removal,
        goes through (see lua/includes/memory.lua), so a consumer that goes on delivering on a
        full server does not look dead."""
        forget_before = now - HEARTBEAT_FORGET_MS
        try:
            pipe = client.pipeline(transaction=False)
            # Forget consumers silent for a day so the set stays small (hourly is plenty).
            prune = now - self._heartbeats_pruned_at.get(id(client), 0) > HEARTBEAT_PRUNE_MS
            for q in queues:
                pipe.zadd(q.keys.heartbeats, {self.name: now})
            for q in queues if prune else []:
                pipe.zremrangebyscore(q.keys.heartbeats, "-inf", forget_before)
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
            for reply in replies:
                if isinstance(reply, Exception) and not is_out_of_memory(reply):
                    logger.debug("heartbeat skipped: %s", reply)  # a key of the wrong type
        except Exception as e:  # down, or a heartbeats key of the wrong type
            logger.debug("heartbeat skipped: %s", e)

    def _leave_heartbeats(self) -> None:
        """Say this consumer is gone, so health stops counting it alive as soon as it stops
        (not ``HEALTH_CONSUMER_SECONDS`` later). Best effort: Redis may be down."""
        for client, queues in self._clients:
            try:
                pipe = client.pipeline(transaction=False)
                for q in queues:
                    pipe.zrem(q.keys.heartbeats, self.name)
                with redis_errors("heartbeat"):
                    pipe.execute()
            except Exception as e:  # down, or a heartbeats key of the wrong type
                logger.debug("heartbeat not removed: %s", e)


def _confirm_acks(flush: Sequence[Any]) -> None:
    """With ``MIN_REPLICAS``, wait for the replicas to have the acks just sent, so that a
    failover does not bring acknowledged messages back. One WAIT covers every queue of the
    server; a timeout is logged, not raised: the deliveries are done, and at worst a failover
    delivers them again (at least once)."""
    queues = [q for q, kind, _ in flush if kind == "ack" and q.replicas is not None]
    # One check per server: every queue of a plain client shares it; on a cluster, each
    # queue's slot has its own primary.
    by_server: dict[object, Queue] = {}
    for q in queues:
        client = q.client
        server = (
            client.get_node_from_key(q.keys.replicated).name
            if isinstance(client, RedisCluster)
            else id(client)
        )
        by_server.setdefault(server, q)
    for q in by_server.values():
        try:
            q.confirm_replicas("acknowledgements")
        except DelayQueueError as e:
            logger.warning("%s; a failover now may deliver them again", e)
