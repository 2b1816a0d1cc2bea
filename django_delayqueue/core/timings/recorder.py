"""What a consumer records of each delivery, as it runs: start lateness, handler duration,
limit wait and outcome, counted per queue in fixed buckets, and flushed to Redis every few
seconds with a maintenance round trip.

Start lateness is the handler's start minus the message's due time, less the time a flow
limit (``rate_limit``, ``max_in_flight``, a flow key's limits) held it back: that wait is
what the site asked for, and is counted apart as the limit wait. Both are read on the
consumer's clock, in whole milliseconds. Approximations, made on the consumer's side
because claim.lua does not say more:

- the limit wait of a message is what claim.lua says it waited on a limit
  (``Message.limit_wait_ms``): the time since it was ready in which the queue's rate or cap,
  or its key's, held ready messages back, kept on the server whichever consumer claimed (see
  lua/includes/limit_waits.lua); the wait from a freed slot or a token's instant to the claim
  that took it is the consumers', and counts as lateness;
- a message that came back to ready (a retry, a requeued dead letter, a "run now", one
  released by a stopping consumer) is due from then if later than its envelope's due time:
  claim.lua gives its ready_since (``Message.ready_since_ms``), the instant the stats count
  it overdue from (a requeued dead letter has fresh attempts: without it, it would be late
  from its first due time, days ago);
- failing that, a retry's due time is its retry time, which this consumer knows when it sent
  the nack itself (kept for the last ``MAX_RETRY_TIMES`` retries it sent, with the attempt it
  is the due time of: the nacked attempt's next); a retry with neither (a claim replayed
  after a lost reply) has no known due time: its lateness is not counted (its duration and
  outcome are);
- a message run early by staff ("run now") counts as 0 ms late.

The counting runs on the consumer's loop thread only (where outcomes are taken from the
handler threads and where rounds are planned), so it takes no lock: a few integer increments
and a bisect per message.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.journal import ACK, GARBAGE
from django_delayqueue.core.scripts.calls import ScriptBatch, ScriptCall
from django_delayqueue.core.scripts.contracts import RECORD_TIMINGS
from django_delayqueue.core.timings.buckets import BOUNDS_MS
from django_delayqueue.core.timings.counts import TimingCounts
from django_delayqueue.core.timings.otel import OtelTimings

if TYPE_CHECKING:
    from django_delayqueue.core.consumer.outcomes import Outcome
    from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)

MINUTE_MS = 60_000
MINUTE_TTL_SECONDS = 3900  # an hour and 5 minutes: the last hour is always there to read
MAX_RETRY_TIMES = 10_000  # retry times remembered (see above); the oldest are forgotten
# The Outcome errors of a handler stopped by its time limit or an abort (handler_run.py).
STOPPED_ERRORS = frozenset({"TimeLimitExceeded", "Aborted"})
STOPPED_REASON = "handler stopped"  # a stop of the consumer that landed as the handler ended

# One flushed call: the queue and the counts its call carries (put back if the call fails).
TimingsFlush = list[tuple[str, TimingCounts, int]]


class DeliveryTimings:
    """The delivery timings of one consumer's queues since its last flush."""

    def __init__(self, queues: Mapping[str, Queue]) -> None:
        self._queues = queues  # by name (the consumer's: queues added later are seen)
        self._counts: dict[str, TimingCounts] = {}
        # By (physical queue, message id): (retry time in ms, the attempt it is the due time
        # of); insertion order, oldest first. Ids are the caller's: two queues may share one.
        self._retry_times: dict[tuple[str, str], tuple[int, int]] = {}
        self.otel = OtelTimings.if_configured()

    # --- the loop thread, per round -------------------------------------------------------------

    def due_of(self, m: Message) -> int | None:
        """The instant ``m``'s start lateness counts from (see the module's docstring), None
        when unknown. Read-only: a delivery span reads it too, from its handler's thread."""
        since = m.ready_since_ms
        if since is not None:
            return since if since > m.due_ms else m.due_ms
        if m.attempt == 1:
            return m.due_ms
        noted = self._retry_times.get((m.queue, m.id)) if self._retry_times else None
        return noted[0] if noted is not None and noted[1] == m.attempt else None

    @staticmethod
    def limit_wait(m: Message) -> int:
        """How long (ms) ``m``'s delivery waited on a flow limit, as its claim said."""
        return m.limit_wait_ms

    def note_retries(self, call: ScriptCall, messages: Sequence[Message]) -> None:
        """A nack call of ``messages`` (the failed deliveries, in the call's order) was sent:
        remember each retried message's retry time, as the due time of its next attempt only
        (nack.lua's ARGV: 4 fixed values, then id, token, retry-at, reason per message; -1:
        to garbage). A later attempt (this one's retry run by another consumer, which retried
        it again) has another due time, unknown here."""
        args, times = call.args, self._retry_times
        for m, i in zip(messages, range(4, len(args) - 3, 4), strict=True):
            retry_at = int(args[i + 2])
            if retry_at >= 0:
                times.pop((m.queue, m.id), None)  # to the end: the newest
                times[(m.queue, m.id)] = (retry_at, m.attempt + 1)
        while len(times) > MAX_RETRY_TIMES:
            del times[next(iter(times))]

    def record(self, outcomes: Sequence[Outcome]) -> None:
        """Count finished deliveries (the loop's thread, as it takes them), and give each its
        limit wait (``Outcome.limit_wait_ms``), which its journal row carries."""
        retry_times, otel = self._retry_times, self.otel
        for o in outcomes:
            m = o.message
            counts = self._counts.get(m.queue)
            if counts is None:
                counts = self._counts[m.queue] = TimingCounts()
            hist, sums = counts.histograms, counts.sums
            waited = m.limit_wait_ms
            o.limit_wait_ms = waited  # for its journal row
            q = self._queues.get(m.queue)
            # Key limits hold messages too (claim.lua): their wait is taken off the lateness
            # below, so it is counted here, not lost from both.
            limited = q is not None and (q.settings.flow_limited or q.settings.key_limited)
            if limited:
                hist["limit_wait"][bisect_left(BOUNDS_MS, waited)] += 1
                sums["limit_wait"] += waited
            due = m.due_ms if m.attempt == 1 and m.ready_since_ms is None else self.due_of(m)
            if m.attempt > 1 and retry_times:  # used: forgotten
                retry_times.pop((m.queue, m.id), None)
            late = None
            if due is not None:
                late = o.started_ms - due - waited
                if late < 0:
                    late = 0
                hist["lateness"][bisect_left(BOUNDS_MS, late)] += 1
                sums["lateness"] += late
            took = o.finished_ms - o.started_ms
            if took < 0:
                took = 0
            hist["duration"][bisect_left(BOUNDS_MS, took)] += 1
            sums["duration"] += took
            # A failure's outcome is counted once its nack replied (count_failure): nack.lua
            # may find it aborted meanwhile, and then it counts as the abort it became.
            kind = None
            if o.status == ACK:
                kind = "ack"
                counts.outcomes["ack"] += 1
            if otel is not None:
                otel.record(
                    q.logical_name if q else m.queue, late, took, waited if limited else None, kind
                )

    def count_failure(self, o: Outcome) -> None:
        """Count the outcome of a failed delivery (timed by :meth:`record`) once its nack
        replied, as what it came to (an abort that landed first: ``stopped``, as any abort)."""
        m = o.message
        q = self._queues.get(m.queue)
        kind = outcome_kind(o, q)
        counts = self._counts.get(m.queue)
        if counts is None:
            counts = self._counts[m.queue] = TimingCounts()
        counts.outcomes[kind] += 1
        if self.otel is not None:
            self.otel.count(q.logical_name if q else m.queue, kind)

    # --- the maintenance round trip -------------------------------------------------------------

    def add_to(self, batch: ScriptBatch, queues: Sequence[Queue], now_ms: int) -> TimingsFlush:
        """Queue the counts of ``queues`` (one server's) since the last flush: one call per
        queue with something counted. What is taken is put back if its call fails."""
        self.refresh()
        flush: TimingsFlush = []
        minute = now_ms // MINUTE_MS
        for q in queues:
            counts = self._counts.pop(q.name, None)
            if not counts:
                continue
            call = RECORD_TIMINGS.call(
                q.keys,
                minute=q.keys.timings_minute(minute),
                ttl_seconds=MINUTE_TTL_SECONDS,
                increments=counts.increments(),
            )
            flush.append((q.name, counts, batch.add(call)))
        return flush

    def read(self, flush: TimingsFlush, results: Sequence[Any]) -> None:
        """Take in the replies: a call that failed for a reason that may pass (a connection)
        gives its counts back for the next flush; one Redis refused (full, a key of the
        wrong type) drops them: the counts are a measure, not data to keep at any cost."""
        for name, counts, index in flush:
            reply = results[index]
            if isinstance(reply, Exception) and not _refused(reply):
                self.put_back([(name, counts, index)])

    def put_back(self, flush: TimingsFlush) -> None:
        """The round trip carrying ``flush`` failed: keep its counts for the next one."""
        for name, counts, _ in flush:
            kept = self._counts.get(name)
            self._counts[name] = counts if kept is None else counts.add(kept)

    def flush_now(self, servers: Sequence[tuple[Any, Sequence[Queue]]], now_ms: int) -> None:
        """At a stop: send what was counted since the last maintenance, one try per server
        (``servers``: each client with its queues); a failure loses those counts, logged."""
        for client, queues in servers:
            batch = ScriptBatch()
            if not self.add_to(batch, queues, now_ms):
                continue
            try:
                batch.run(client, raise_errors=False)
            except DelayQueueError as e:
                logger.info("delivery timings of the last seconds not recorded: %s", e)

    def pending(self) -> bool:
        """Whether counts wait to be flushed."""
        return any(self._counts.values())

    def refresh(self) -> None:
        """Pick up a MeterProvider configured since the consumer started (maintenance)."""
        if self.otel is None:
            self.otel = OtelTimings.if_configured()


def outcome_kind(o: Outcome, q: Queue | None) -> str:
    """ack, retry, dead or stopped (see counts.OUTCOMES)."""
    if o.status == ACK:
        return "ack"
    if o.error in STOPPED_ERRORS or o.reason.startswith(STOPPED_REASON):
        return "stopped"
    if o.status == GARBAGE:
        return "dead"
    # A failure on the last attempt goes to the dead letters (nack.lua), as the journal says.
    if q is not None and o.message.attempt >= q.settings.max_attempts:
        return "dead"
    return "retry"


def _refused(error: Exception) -> bool:
    import redis

    return isinstance(error, redis.exceptions.ResponseError)
