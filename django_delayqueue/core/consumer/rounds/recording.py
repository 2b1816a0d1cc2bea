"""Outcomes of finished deliveries, waiting to be written to Redis with the next round trip.

The consumer does not acknowledge each message as its handler returns: the acks, nacks and one
journal entry per queue ride on the pipeline of the next promote + claim, so recording costs
no round trip of its own; so do the writes a handler left for its ack (``WritesWithAck``: a
task's result), sent beside a round trip (:mod:`.writes_ahead`; at a stop, in it, before the
acks), each message acked only once Redis has its write, the write's ``then`` run once the ack
has landed. An outcome stays
here until Redis has both its state change (ack, nack, burial) and its journal row, each tracked
apart: when one call fails only what that call carried is sent again, so an ack is never
repeated because a journal write failed, and one broken queue never holds back another's
outcomes. A queue whose calls fail is tried again after a pause, not every round; a journal row
that keeps failing on a script error (say, the journal key holds the wrong type) is dropped
after a few tries, with an error naming the ids, rather than kept in memory for ever; a nack
the script refuses is dropped at once, logged, its message left in flight for the reaper. An
outage
(the whole pipeline fails) keeps everything, the early writes (``write_soon``) included: each
leaves only once a reply says it ran. When Redis is out of memory the journal rows it
refuses are dropped at once (the deliveries' acks go on: they free memory) and counted by the
consumer's :class:`~django_delayqueue.core.out_of_memory.OutOfMemoryLog`, which logs the
condition once rather than every round. Outcomes are counted in ``timings`` (core.timings)
as they come in, a failure's outcome once its nack replied (nack.lua may find it aborted: it
counts as an abort then), when its delivery span (tracing on) ends too. A task's failure
that its runner recorded as a retry and nack.lua buried as aborted gets its record written
FAILED, Aborted, with the next round, and the consumer is told once it is (``retry_buried``:
the Tasks side sends ``task_finished``, which the runner did not for a retry). The recorder
rides on every round trip, as the recurring keeper does (see :mod:`.rounds.parts`):
``add_to`` adds its calls to a server's pipeline, ``read`` its replies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from django_delayqueue.core.consumer.limits.stopped import (
    LATE_ABORT_REASON,
    StoppedHandler,
    record_stop,
)
from django_delayqueue.core.consumer.outcomes import (
    ACK,
    GARBAGE,
    Outcome,
    WhileRunning,
    aborted_outcome,
    is_aborted,
    journal_entry,
)
from django_delayqueue.core.consumer.rounds.merged_writes import (
    is_merged,
    merged_writes,
    record_replies,
)
from django_delayqueue.core.consumer.rounds.replica_acks import confirm_acks as _confirm_acks
from django_delayqueue.core.consumer.rounds.writes_ahead import WritesAhead
from django_delayqueue.core.delivery import NACK_ABORTED, NACK_DEAD, nack_aborted_reasons
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.log_fields import message_fields
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import (
    ScriptBatch,
    ScriptCall,
    is_out_of_memory,
    passes_by_itself,
)
from django_delayqueue.core.scripts.contracts import JOURNAL
from django_delayqueue.core.timings.recorder import DeliveryTimings

logger = logging.getLogger(__name__)

FAILED_QUEUE_PAUSE_SECONDS = 1.0  # a queue whose calls failed is tried again after this
# At a stop, how long its last rounds wait for the writes sent ahead to be replied to (their
# acks follow them); past it, those outcomes are left unrecorded: their messages come back.
STOP_WAITS_FOR_WRITES_SECONDS = 1.0
JOURNAL_TRIES = 3  # a journal row whose call failed this often on a script error is dropped

CallKind = Literal["early", "write", "ack", "retry", "bury", "journal"]

# Told that a task's failed delivery its runner recorded as a retry (READY; it told no one the
# task ended) was buried by nack.lua as aborted: (its queue, its message, the dead letter's
# reason). Called on the loop's thread once the task's record says FAILED, Aborted.
RetryBuried = Callable[[Queue, Message, str], None]


@dataclass(eq=False)
class _Entry:
    outcome: Outcome
    recorded: bool = False  # its ack/nack ran
    journalled: bool = False  # its journal row was written (or there is no journal)
    journal_failures: int = 0
    written: bool = False  # what the handler left to write with the ack ran (or there is none)
    ahead: bool = False  # that write is with WritesAhead: its message is acked once it replied
    # A write sent ahead that Redis took: its reply, for its ``then`` once the ack has landed
    # (as in a round trip, where the ack goes in the write's pipeline: a task_finished
    # receiver finds the message gone).
    then_reply: Any = None
    then_after_ack: bool = False

    @property
    def done(self) -> bool:
        return self.recorded and self.journalled and self.written

    @property
    def unsent(self) -> int:
        """How many of its calls Redis does not have yet (a pass that lowers it did work)."""
        return (not self.recorded) + (not self.journalled) + (not self.written)

    @property
    def journal_ready(self) -> bool:
        """Whether its journal row can go: an ack's with it, a failure's once its nack replied
        (with the next round, due at once: ``journal_due``). An abort that landed after the
        handler ended (or was stopped at a time limit) and before the nack wins: nack.lua
        dead-letters the message as aborted (``NACK_ABORTED``), and the journal row, the log
        line and a task's record say ``Aborted`` too, not what the handler did (issue 36)."""
        return not self.journalled and (self.recorded or self.outcome.status == ACK)


# One flushed call: the queue, what kind of call, the entries it carries (for "early": the
# call itself), and its index in the batch's results.
Flush = list[tuple[Queue, CallKind, list[Any], int]]


class UnrecordedOutcomes:
    """What finished deliveries did, until Redis has it (acks, nacks, the journal)."""

    def __init__(
        self,
        queues: Sequence[Queue],
        journal_maxlen: int,
        memory: OutOfMemoryLog | None = None,
        retry_buried: RetryBuried | None = None,
        writes_ahead: WritesAhead | None = None,
    ) -> None:
        self._by_name = {q.name: q for q in queues}
        # Where handlers' writes (a task's result) go beside the round trip rather than in it
        # (rounds/writes_ahead.py); None: in the round trip, before their acks.
        self._writes_ahead = writes_ahead
        # The writes the last add_to left for send_ahead (its queues' server's), with what
        # each carries.
        self._to_send: list[tuple[ScriptCall, tuple[Queue, list[_Entry]]]] = []
        self._retry_buried = retry_buried
        # The early calls (by id) whose landing tells retry_buried: each call kept with what
        # it tells, so an id is never mistaken for a later call's.
        self._told_when_written: dict[int, tuple[ScriptCall, Queue, Message, str]] = {}
        self.journal_maxlen = journal_maxlen
        self.memory = memory or OutOfMemoryLog(logger)
        self._entries: dict[str, list[_Entry]] = {}
        self._lock = threading.Lock()  # the extender reads unrecorded_messages() on its thread
        self._paused_until: dict[str, float] = {}
        self._early: dict[str, list[ScriptCall]] = {}  # write_soon(), per queue, in order
        # write_soon()'s calls until the loop takes them into _early (under the lock): a deque,
        # whose append and popleft need no lock, so that a handler thread handing one over
        # (a task's RUNNING, for every task it starts) never waits for the loop's lock.
        self._handed: deque[tuple[str, ScriptCall]] = deque()
        # write_soon()'s WhileRunning writes, until the loop's next round takes them: a dict
        # that handler threads add to and only the loop removes from, each at once.
        self._while_running: dict[WhileRunning, str] = {}
        self.timings = DeliveryTimings(self._by_name)  # counted on the loop's thread (extend)

    def add_queue(self, q: Queue) -> None:
        """Record the outcomes of queue ``q`` too (a queue added to a running consumer)."""
        with self._lock:
            self._by_name[q.name] = q

    def write_soon(self, name: str, call: ScriptCall | WhileRunning) -> None:
        """Send ``call`` (a script call on queue ``name``) with the next round trip, before
        every write and ack of an outcome, without waiting for it (from a handler thread). A
        call the script refuses is dropped, logged. A :class:`WhileRunning` (a running task's
        RUNNING) is built and sent by the next round only if its handler has not ended."""
        if isinstance(call, WhileRunning):
            self._while_running[call] = name
        else:
            self._handed.append((name, call))

    def _take_running(self, names: set[str]) -> None:
        """Hand over the writes of handlers still running (``WhileRunning``) of ``names``; forget
        those that ended. Each is taken once: only the loop pops them."""
        pending = self._while_running
        if not pending:
            return
        for write, name in pending.copy().items():  # a copy: handler threads add to it
            if name not in names:
                continue
            del pending[write]
            if write.ended:
                continue
            try:
                call = write.taken = write.call()
            except Exception:  # never the round's fault: the write is lost, logged
                logger.exception("queue %s: a running handler's write not built", name)
                continue
            self._handed.append((name, call))

    def _take_handed(self) -> None:
        """Move the calls handed over by write_soon into _early, in order (under the lock)."""
        handed, early = self._handed, self._early
        while handed:
            name, call = handed.popleft()  # the only taker: never empty after the check
            early.setdefault(name, []).append(call)

    def __len__(self) -> int:
        return sum(self.left())

    def left(self) -> tuple[int, int]:
        """How many outcomes, and how many early writes (write_soon), are not recorded yet."""
        # Under the lock: the loop adds queues to _early (taking what write_soon handed over)
        # while another thread may count, and a dict that grows while iterated raises.
        with self._lock:
            early = len(self._handed) + sum(len(calls) for calls in self._early.values())
            return sum(len(entries) for entries in self._entries.values()), early

    def extend(self, outcomes: Sequence[Outcome]) -> None:
        self.timings.record(outcomes)
        journalled = not self.journal_maxlen
        with self._lock:
            for outcome in outcomes:
                entry = _Entry(outcome, journalled=journalled, written=outcome.writes is None)
                self._entries.setdefault(outcome.message.queue, []).append(entry)

    def unsent(self) -> int:
        """How many calls of the outcomes Redis does not have yet (ack or nack, journal row,
        the handler's write): a pass that lowers it recorded something."""
        with self._lock:
            return sum(e.unsent for entries in self._entries.values() for e in entries)

    def journal_due(self) -> bool:
        """Whether a journal row waits only for a round to carry it (its failure's nack has
        replied), on a queue not pausing after failed calls: a round is due now."""
        clock = time.monotonic()
        with self._lock:
            return any(
                self._paused_until.get(name, 0.0) <= clock
                and any(e.journal_ready and e.recorded for e in entries)
                for name, entries in self._entries.items()
            )

    def end_spans(self) -> None:
        """End the delivery spans of failures not recorded yet (at a stop: their nacks may
        never reply), with the outcome they had so far."""
        with self._lock:
            for entries in self._entries.values():
                for e in entries:
                    span, e.outcome.span = e.outcome.span, None
                    if span is not None:
                        span.end()

    def pause(self, names: Sequence[str], seconds: float) -> None:
        """Leave the outcomes of queues ``names`` alone for ``seconds`` (their server is down):
        nor does a failure's journal row owed there make a round due meanwhile
        (:meth:`journal_due`), which would run round after round against that server."""
        until = time.monotonic() + seconds
        with self._lock:
            for name in names:
                if name in self._entries or name in self._early:
                    self._paused_until[name] = max(self._paused_until.get(name, 0.0), until)

    def unrecorded_messages(self, name: str) -> list[Message]:
        """Messages of queue ``name`` whose state change Redis does not have yet.

        They are still in unack: the extender keeps their deadlines moving (from its own
        thread, hence the lock) so that no reap delivers them again meanwhile.
        """
        with self._lock:
            return [e.outcome.message for e in self._entries.get(name, []) if not e.recorded]

    def add_to(
        self,
        batch: ScriptBatch,
        queues: Sequence[Queue],
        now_ms: int,
        *,
        force: bool = False,
    ) -> Flush:
        """Queue the early writes, acks, nacks and journal entry of ``queues`` (one server's).

        A queue whose last calls failed waits out its pause, unless ``force`` (at shutdown).
        """
        names = {q.name for q in queues}
        flush: Flush = []
        clock = time.monotonic()
        ahead = self._writes_ahead
        # Handlers' writes go beside the round trip (then their acks wait for a later round),
        # except at a stop (force: its last rounds record everything they can, in order).
        sends_ahead = ahead is not None and not force
        self._to_send = []
        if ahead is not None:  # what Redis replied to the writes sent ahead: acked below
            self._take_ahead(ahead.collect(STOP_WAITS_FOR_WRITES_SECONDS if force else 0.0))
        # The keys this round's early calls write: a write on one of them goes in the round
        # trip after them (a write sent ahead is not ordered with the round trip's calls).
        early_keys: set[Any] = set()
        with self._lock:
            self._take_running(names)
            self._take_handed()
            for name in [n for n in self._early if n in names]:
                if force or self._paused_until.get(name, 0.0) <= clock:
                    # Left in _early until settle() sees them run: a round whose pipeline
                    # fails (an outage) never reaches settle(), and must not lose them.
                    needless = self._superseded(name)
                    kept = [c for c in self._early[name] if id(c) not in needless]
                    self._early[name] = kept
                    for call in kept:
                        flush.append((self._by_name[name], "early", [call], batch.add(call)))
                        early_keys.update(call.keys)
                    if not kept:
                        del self._early[name]
        for name, entries in self._entries.items():
            if name not in names:
                continue
            if not force and self._paused_until.get(name, 0.0) > clock:
                continue
            q = self._by_name[name]
            # Before the acks: a task's result before its message goes, in this round trip
            # (its ack after it, in the same pipeline) or sent ahead (its ack in the round
            # after Redis replied to it).
            writing = [
                e for e in entries if not e.written and not e.ahead and e.outcome.writes is not None
            ]
            written_here: set[int] = set()
            for call, carried in merged_writes(writing):
                if sends_ahead and early_keys.isdisjoint(call.keys):
                    self._to_send.append((call, (q, carried)))
                else:
                    flush.append((q, "write", carried, batch.add(call)))
                    written_here.update(id(e) for e in carried)
            todo = [e for e in entries if not e.recorded]
            acks = [
                e for e in todo if e.outcome.status == ACK and (e.written or id(e) in written_here)
            ]
            retry = [e for e in todo if e.outcome.status not in (ACK, GARBAGE)]
            bury = [e for e in todo if e.outcome.status == GARBAGE]
            if acks:
                call = q.ack_call([e.outcome.message for e in acks])
                flush.append((q, "ack", acks, batch.add(call)))
            if retry:
                failures = [(e.outcome.message, e.outcome.delay, e.outcome.reason) for e in retry]
                call = q.nack_call(failures, now_ms)
                # Their retry times: their next attempts' due times.
                self.timings.note_retries(call, [f[0] for f in failures])
                flush.append((q, "retry", retry, batch.add(call)))
            if bury:
                failures = [(e.outcome.message, None, e.outcome.reason) for e in bury]
                call = q.nack_call(failures, now_ms, bury=True)
                flush.append((q, "bury", bury, batch.add(call)))
            # An ack's row goes with its ack (one whose write is still to land waits for it).
            acked = {id(e) for e in acks}
            unjournalled = [
                e for e in entries if e.journal_ready and (e.recorded or id(e) in acked)
            ]
            if unjournalled:
                call = self._journal_call(q, [e.outcome for e in unjournalled])
                flush.append((q, "journal", unjournalled, batch.add(call)))
        return flush

    def send_ahead(self, client: Any) -> None:
        """Hand the writes the last :meth:`add_to` left to WritesAhead (``client``: the server
        of its queues), as the round trip's own pipeline goes out: Redis writes them after it."""
        to_send, self._to_send = self._to_send, []
        if not to_send or self._writes_ahead is None:
            return
        self._writes_ahead.send(client, to_send)  # if it raises, nothing is marked: sent again
        for _, (_, carried) in to_send:
            for e in carried:
                e.ahead = True

    def _take_ahead(self, done: list[tuple[list[Any], Any]]) -> None:
        """Take in Redis's replies to writes sent ahead (``WritesAhead.collect``), as settle()
        does a round trip's: written (then their ``then``), or kept to send again."""
        for calls, results in done:
            for i, (_, (q, carried)) in enumerate(calls):
                result = results if isinstance(results, Exception) else results[i]
                for e in carried:
                    e.ahead = False
                if len(carried) == 1 and not is_merged(carried[0]):
                    self._written(q, carried[0], result, after_ack=True)
                else:
                    replies = record_replies(result, len(carried))
                    for e, reply in zip(carried, replies, strict=True):
                        self._written(q, e, reply, after_ack=True)
                if not all(e.written for e in carried):
                    # Kept to send again (Redis full, a broken connection): after a pause, as
                    # a round trip's failed calls are, not at once round after round (its
                    # reply makes a round due: recording_due).
                    self._paused_until[q.name] = time.monotonic() + FAILED_QUEUE_PAUSE_SECONDS

    def recording_due(self) -> bool:
        """Whether a round is due now to record what waits only for one: a failure's journal
        row (:meth:`journal_due`), or the acks of writes Redis replied to (sent ahead)."""
        ahead = self._writes_ahead
        return (ahead is not None and ahead.replied()) or self.journal_due()

    def close(self) -> None:
        """End the thread that sends writes ahead (once what it holds is sent)."""
        if self._writes_ahead is not None:
            self._writes_ahead.close()

    def read(self, flush: Flush, results: Sequence[Any], now_ms: int) -> None:
        """Take in the replies to ``flush`` (``results``: the whole batch's), then, with
        ``MIN_REPLICAS``, wait for the replicas to have the acks."""
        self.settle(flush, results)
        _confirm_acks(flush)

    def settle(self, flush: Flush, results: Sequence[Any]) -> None:
        """Mark what Redis now has; keep, per call, only what a failed call carried."""
        failed: dict[str, Any] = {}
        for q, kind, entries, index in flush:
            result = results[index]
            if kind == "early":
                self._early_done(q, entries[0], result)
                continue
            if kind == "write":
                if len(entries) == 1 and not is_merged(entries[0]):
                    self._written(q, entries[0], result)
                    continue
                # A merged call: one reply per write, or one error for them all.
                for e, reply in zip(entries, record_replies(result, len(entries)), strict=True):
                    self._written(q, e, reply)
                continue
            if isinstance(result, Exception):
                if kind == "journal" and self._journal_refused(q, entries, result):
                    continue
                if kind in ("retry", "bury") and self._nack_refused(q, entries, result):
                    continue
                failed.setdefault(q.name, result)
                if kind == "journal":
                    self._journal_failed(q, entries, result)
                continue
            if kind == "journal":
                for e in entries:
                    e.journalled = True
                self.memory.taken()  # an XADD went through: Redis has room
                continue
            for e in entries:
                e.recorded = True
                if e.then_after_ack:  # its write was sent ahead: its then() waited for this
                    e.then_after_ack = False
                    self._then(q, e, e.then_reply)
            if isinstance(result, list):
                self._nacked(q, kind, entries, result)
            if kind != "ack":  # a failure counts as what its nack made of it, its span too
                for e in entries:
                    self.timings.count_failure(e.outcome)
                    span = e.outcome.span
                    if span is not None:
                        e.outcome.span = None
                        span.end()
        for name, error in failed.items():
            left = sum(1 for e in self._entries.get(name, []) if not e.done)
            if not self.memory.check(error, f"queue {name}: recording {left} outcome(s)"):
                logger.error("queue %s: could not record %d outcome(s): %s", name, left, error)
            self._paused_until[name] = time.monotonic() + FAILED_QUEUE_PAUSE_SECONDS
        with self._lock:
            for name in list(self._entries):
                kept = [e for e in self._entries[name] if not e.done]
                if kept:
                    self._entries[name] = kept
                else:
                    del self._entries[name]
                    self._paused_until.pop(name, None)

    def _superseded(self, name: str) -> set[int]:
        """The early calls of queue ``name`` that an outcome's writes, still to go, make
        needless (a task that ran before its RUNNING was sent: its result says it all)."""
        found = set()
        for e in self._entries.get(name, []):
            writes = e.outcome.writes
            if writes is not None and writes.supersedes is not None and not e.written:
                found.add(id(writes.supersedes))
        return found

    def _early_done(self, q: Queue, call: ScriptCall, result: Any) -> None:
        """An early call ran, or was refused for ever: it leaves _early. Any other failure
        (Redis full, a connection error) keeps it there, in its place, for the next round."""
        if isinstance(result, Exception):
            full = self.memory.check(result, f"queue {q.name}: an early write")
            if not isinstance(result, redis.exceptions.ResponseError) or full:
                return  # not the script's fault: sent again with the next round
            logger.error("queue %s: an early write dropped: %s", q.name, result)
        with self._lock:
            calls = [c for c in self._early.get(q.name, []) if c is not call]
            if calls:
                self._early[q.name] = calls
            else:
                self._early.pop(q.name, None)
        told = self._told_when_written.pop(id(call), None)
        if told is not None and self._retry_buried is not None:
            _, queue, message, reason = told
            try:
                self._retry_buried(queue, message, reason)
            except Exception:  # never the round's fault
                logger.exception(
                    "queue %s: message %s: after its record said aborted",
                    queue.name,
                    message.id,
                    extra=message_fields(message),
                )

    def _written(self, q: Queue, entry: _Entry, result: Any, after_ack: bool = False) -> None:
        """A handler's write ran (then its ``then``: ``after_ack``, once its ack has landed),
        or failed: sent again unless the script refused it (a key of the wrong type would
        refuse it for ever: dropped, logged)."""
        message_id = entry.outcome.message.id
        if isinstance(result, Exception):
            if self.memory.check(result, f"queue {q.name}: message {message_id}'s write"):
                return  # Redis is full: try again with the next round
            if not isinstance(result, redis.exceptions.ResponseError):
                return  # not the script's fault: try again with the next round
            logger.error(
                "queue %s: message %s: handler's write dropped: %s",
                q.name,
                message_id,
                result,
                extra=message_fields(entry.outcome.message),
            )
        entry.written = True
        writes = entry.outcome.writes
        if writes is not None and writes.then is not None and not isinstance(result, Exception):
            if after_ack and not entry.recorded:
                entry.then_reply, entry.then_after_ack = result, True
                return
            self._then(q, entry, result)

    @staticmethod
    def _then(q: Queue, entry: _Entry, result: Any) -> None:
        """Run what the handler left to run once Redis has its write (``WritesWithAck.then``)."""
        writes = entry.outcome.writes
        if writes is None or writes.then is None:
            return
        try:
            writes.then(result)
        except Exception:
            logger.exception(
                "queue %s: message %s: after its write",
                q.name,
                entry.outcome.message.id,
                extra=message_fields(entry.outcome.message),
            )

    def _journal_refused(self, q: Queue, entries: list[_Entry], error: Any) -> bool:
        """Whether Redis refused the journal rows for memory: then they are dropped now (kept,
        they would pile up in this process for as long as Redis is full) and counted."""
        count = len(entries)
        if not self.memory.check(error, f"queue {q.name}: the journal", dropped=count):
            return False
        for e in entries:
            e.journalled = True
        return True

    def _nack_refused(self, q: Queue, entries: list[_Entry], error: Any) -> bool:
        """Whether nack.lua refused the failures for good (a script error, not memory: a key
        of the wrong type would refuse them for ever): then their outcomes are dropped now,
        journal rows and all, each logged. Their messages stay in flight, no longer extended:
        the reaper delivers them again once their lease ends (at-least-once), as it would after
        a crash. Sent again instead, they stayed here until the consumer stopped."""
        if not isinstance(error, redis.exceptions.ResponseError) or is_out_of_memory(error):
            return False  # not the script's fault: sent again with the next round
        if passes_by_itself(error):
            return False  # a failover or a cluster moving slots: the next try lands
        for e in entries:
            e.recorded = e.journalled = True  # no journal row for a nack that did not run
            span, e.outcome.span = e.outcome.span, None
            if span is not None:  # ends with the outcome it had: nothing recorded it
                span.end()
            m = e.outcome.message
            logger.error(
                "queue %s: message %s: nack refused, left in flight for the reaper: %s",
                q.name,
                m.id,
                error,
                extra=message_fields(m),
            )
        return True

    def _journal_failed(self, q: Queue, entries: list[_Entry], error: Any) -> None:
        if not isinstance(error, redis.exceptions.ResponseError):
            return  # not the script's fault: try again
        for e in entries:
            e.journal_failures += 1
        dropped = [e for e in entries if e.journal_failures >= JOURNAL_TRIES]
        for e in dropped:
            e.journalled = True  # given up: the state change is what matters
        if dropped:
            logger.error(
                "queue %s: journal rows of %d delivery(ies) dropped after %d failed writes "
                "(ids %s): %s",
                q.name,
                len(dropped),
                JOURNAL_TRIES,
                ", ".join(e.outcome.message.id for e in dropped[:20]),
                error,
            )

    def _nacked(self, q: Queue, kind: CallKind, entries: list[_Entry], codes: list[Any]) -> None:
        """What nack.lua did with failures: a retry that used the last attempt is logged; one
        it dead-lettered because an abort came first becomes an abort's outcome (its journal
        row, not sent yet, says so), and a task's record says ``Aborted`` too."""
        told = iter(nack_aborted_reasons(codes, len(entries)))
        for e, code in zip(entries, codes, strict=False):
            m = e.outcome.message
            if int(code) != NACK_ABORTED:
                if kind == "retry" and int(code) == NACK_DEAD:
                    logger.warning(
                        "queue %s: message %s used its last attempt: %s",
                        q.name,
                        m.id,
                        e.outcome.reason,
                        extra=message_fields(m),
                    )
                continue
            # The dead letter's reason ("aborted: <the abort's reason>"), as nack.lua gave it,
            # so that the log line, the span and a task's error say what the dead letter says.
            reason = next(told, LATE_ABORT_REASON)
            if not is_aborted(e.outcome):
                logger.warning(
                    "queue %s: message %s was aborted before its failure was recorded (%s): "
                    "dead-lettered as %s, not retried",
                    q.name,
                    m.id,
                    e.outcome.reason,
                    reason,
                    extra=message_fields(m),
                )
                e.outcome = aborted_outcome(e.outcome, reason)
                if e.outcome.span is not None:  # its span says so too, as a direct abort's
                    e.outcome.span.outcome = "stopped"
                    e.outcome.span.reason = reason
                if m.task:  # its runner wrote READY (or FAILED) with what the handler raised
                    stop = StoppedHandler.of(m, "dead", reason)
                    call = record_stop(q, stop, dead=True)
                    self._handed.append((q.name, call))
                    # A retry as its runner saw it (attempts left: READY) told no one the task
                    # ended; its last attempt's failure, or a Reject's, did as it ended (a
                    # max_attempts changed between the two would tell twice, or none).
                    retried = kind == "retry" and m.attempt < q.settings.max_attempts
                    if retried and self._retry_buried is not None:
                        self._told_when_written[id(call)] = (call, q, m, reason)

    def _journal_call(self, q: Queue, outcomes: list[Outcome]) -> ScriptCall:
        fields = [
            item
            for pair in journal_entry(outcomes, q.settings.max_attempts).items()
            for item in pair
        ]
        return JOURNAL.call(q.keys, max_length=self.journal_maxlen, fields=fields)
