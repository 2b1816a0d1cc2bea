"""core.timings: what the consumer records of each delivery (start lateness, handler duration,
limit wait, outcome), flushed to the queue's totals and minute hashes in Redis, and read back.

The deliveries run on a ManualClock in burst mode, so every start lateness is exact: the clock
stands still while the consumer runs, and a handler starts at the instant the clock reads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import redis
from core_consumer_support import T0, burst

from django_delayqueue.core import Message, Reject, Retry, SystemClock
from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.journal import ACK, RETRY
from django_delayqueue.core.timings.buckets import BOUNDS_MS, BUCKETS, bucket_of, quantile_ms
from django_delayqueue.core.timings.counts import TimingCounts
from django_delayqueue.core.timings.reading import TimingWindows, read_call, read_result
from django_delayqueue.core.timings.recorder import (
    MINUTE_MS,
    MINUTE_TTL_SECONDS,
    DeliveryTimings,
)


def totals(client: redis.Redis, q: Any) -> TimingCounts:
    flat = [x for pair in client.hgetall(q.keys.timings).items() for x in pair]
    return TimingCounts.from_hash(flat)


# --- buckets and quantiles ----------------------------------------------------------------------


def test_buckets_are_inclusive_upper_bounds_with_inf_last() -> None:
    assert bucket_of(0) == 0
    assert bucket_of(1) == BOUNDS_MS.index(1)
    assert bucket_of(1.5) == BOUNDS_MS.index(2)
    assert bucket_of(300_000) == BUCKETS - 2
    assert bucket_of(300_001) == BUCKETS - 1


def test_quantiles_interpolate_inside_their_bucket() -> None:
    counts = [0] * BUCKETS
    counts[bucket_of(7)] = 100  # all in (5, 10]
    assert quantile_ms(counts, 0.5) == pytest.approx(7.5)
    assert quantile_ms(counts, 0.99) == pytest.approx(9.95)
    counts[bucket_of(400)] = 100  # half of them in (250, 500]
    assert quantile_ms(counts, 0.5) == pytest.approx(10)
    assert 250 < quantile_ms(counts, 0.99) <= 500  # type: ignore[operator]
    assert quantile_ms([0] * BUCKETS, 0.5) is None


def test_a_lateness_between_one_and_five_minutes_reads_close_to_what_it_was(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    """Issue 38: with no bucket between 60 s and 300 s, handlers 83 s late read as a p99 of
    287 s. Now the bucket that holds them is (60 s, 90 s], in Redis and read back."""
    q = make_queue()
    q.schedule_many([{"payload": i} for i in range(100)])
    manual_clock.advance(83)
    burst([q], lambda m: None)
    got = totals(redis_client, q)
    assert got.count("lateness") == 100
    assert 60_000 < got.quantile_ms("lateness", 0.99) <= 90_000  # type: ignore[operator]


def test_counts_written_before_the_buckets_between_60_s_and_300_s_keep_their_bounds(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A totals hash as a release without the new buckets wrote it (or a consumer of that
    release writes it during a deploy): field 17 counted (60 s, 300 s], field 18 +Inf. They
    are read in the buckets with the same upper bounds, the new ones take fields of their own,
    so nothing already counted moves below its bound."""
    q = make_queue()
    old_layout = {"l16": 5, "l17": 3, "l18": 2, "l_sum": 1_000_000}
    redis_client.hset(q.keys.timings, mapping=old_layout)
    got = totals(redis_client, q)
    assert got.histograms["lateness"][BOUNDS_MS.index(60_000)] == 5
    assert got.histograms["lateness"][BOUNDS_MS.index(300_000)] == 3
    assert got.histograms["lateness"][BUCKETS - 1] == 2  # +Inf
    assert got.count("lateness") == 10
    # A reading in a new bucket is written under a new field, which adds up with the old ones.
    new = TimingCounts()
    new.histograms["lateness"][bucket_of(100_000)] = 4  # (90 s, 120 s]
    increments = dict(zip(new.increments()[::2], new.increments()[1::2], strict=True))
    assert set(increments) == {"l20"}
    redis_client.hincrby(q.keys.timings, "l20", 4)
    again = totals(redis_client, q)
    assert again.histograms["lateness"][bucket_of(100_000)] == 4
    assert again.histograms["lateness"][BOUNDS_MS.index(300_000)] == 3


# --- the consumer records, flushes at its stop ----------------------------------------------------


def test_lateness_duration_and_outcomes_reach_redis(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=1)
    q.schedule_many([{"payload": i} for i in range(10)])  # due at T0
    q.schedule("bad", id="bad")
    manual_clock.advance(ms=7)  # every handler starts 7 ms late

    def handler(m: Message) -> None:
        if m.payload == "bad":
            raise ValueError("no")  # its only attempt: dead

    burst([q], handler)
    got = totals(redis_client, q)
    assert got.histograms["lateness"][bucket_of(7)] == 11
    assert got.count("lateness") == 11 and got.sums["lateness"] == 77
    assert got.count("duration") == 11
    assert got.outcomes == {"ack": 10, "retry": 0, "dead": 1, "stopped": 0}
    assert got.count("limit_wait") == 0  # no flow limit: nothing recorded
    # The same counts in this minute's hash, which expires a little over an hour later.
    minute_key = q.keys.timings_minute(T0 // MINUTE_MS)
    assert 0 < redis_client.ttl(minute_key) <= MINUTE_TTL_SECONDS
    assert MINUTE_TTL_SECONDS > 3600
    assert redis_client.ttl(q.keys.timings) == -1  # the totals never expire
    # Bounded whatever the traffic: a fixed set of fields (buckets, sums, outcomes).
    assert redis_client.hlen(q.keys.timings) <= 3 * (BUCKETS + 1) + 4
    windows = read_result(read_call(q.keys, T0).run(redis_client))
    assert windows.last_5m.count("lateness") == 11
    assert 5 < windows.last_5m.quantile_ms("lateness", 0.5) <= 10  # type: ignore[operator]


def test_a_retry_is_late_from_its_retry_time_not_its_first_due_time(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    manual_clock.advance(ms=3000)  # the first attempt starts 3 s late

    def handler(m: Message) -> None:
        if m.attempt == 1:
            raise Retry(delay=0)  # due again at once: its retry is not late

    burst([q], handler)
    got = totals(redis_client, q)
    assert got.histograms["lateness"][bucket_of(3000)] == 1
    assert got.histograms["lateness"][bucket_of(0)] == 1
    assert got.outcomes["retry"] == 1 and got.outcomes["ack"] == 1


def test_reject_counts_as_dead(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x")

    def handler(m: Message) -> None:
        raise Reject("no")

    burst([q], handler)
    assert totals(redis_client, q).outcomes["dead"] == 1


def test_minutes_outside_the_windows_are_not_read(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x")
    burst([q], lambda m: None)
    six_minutes_on = T0 + 6 * MINUTE_MS
    windows = read_result(read_call(q.keys, six_minutes_on).run(redis_client))
    assert windows.last_5m.count("lateness") == 0
    assert windows.last_hour.count("lateness") == 1
    hour_on = read_result(read_call(q.keys, T0 + 60 * MINUTE_MS).run(redis_client))
    assert hour_on.last_hour.count("lateness") == 0 and hour_on.total.count("lateness") == 1


def test_the_minutes_of_the_hour_are_read_one_by_one_newest_first(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """What the admin's charts draw: each minute's counts where they fell (the current one
    first), and a sharded queue's minutes added up minute by minute."""
    q = make_queue()
    q.schedule("x")
    burst([q], lambda m: None)  # delivered in minute T0
    windows = read_result(read_call(q.keys, T0 + 3 * MINUTE_MS).run(redis_client))
    assert len(windows.minutes) == 60
    assert [i for i, m in enumerate(windows.minutes) if m] == [3]  # three minutes ago
    assert windows.minutes[3].outcomes["ack"] == 1 and windows.minutes[3].count("lateness") == 1
    merged = TimingWindows.merged([windows, windows])
    assert len(merged.minutes) == 60 and merged.minutes[3].outcomes["ack"] == 2
    assert merged.last_hour.outcomes["ack"] == 2


def test_a_rate_limited_queue_counts_its_wait_apart(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(clock=SystemClock(), rate_limit="20/s", concurrency=2)
    q.schedule_many([{"payload": i} for i in range(6)])
    burst([q], lambda m: None)
    got = totals(redis_client, q)
    assert got.count("limit_wait") == 6 and got.count("lateness") == 6
    # One start per 50 ms (burst 1): the i-th message cannot be claimed before 50 * (i - 1) ms
    # after the first claim, which found the queue held; each claim may lead by 5 ms.
    assert got.sums["limit_wait"] >= 50 * (1 + 2 + 3 + 4 + 5) - 5 * 5


# --- the recorder alone -------------------------------------------------------------------------


def message(token: str, due: int, attempt: int = 1, queue: str = "q") -> Message:
    return Message(token, queue, None, due, due, attempt, token, 0)


def test_limit_wait_is_taken_off_the_lateness() -> None:
    timings = DeliveryTimings({})
    # a: due at T0 - 10, started at T0 + 103, 100 ms of that on a limit (its claim said so);
    # b: due at T0 + 20, started at T0 + 100, all 80 ms on the limit.
    late = replace(message("a", T0 - 10), limit_wait_ms=100)
    held = replace(message("b", T0 + 20), limit_wait_ms=80)
    timings.record([Outcome(late, ACK, T0 + 103, T0 + 104), Outcome(held, ACK, T0 + 100, T0 + 100)])
    counts = timings._counts["q"]
    assert counts.histograms["lateness"][bucket_of(13)] == 1
    assert counts.histograms["lateness"][bucket_of(0)] == 1
    assert DeliveryTimings.limit_wait(late) == 100


def test_an_unknown_retry_time_leaves_the_lateness_out() -> None:
    timings = DeliveryTimings({})
    failed = Outcome(message("a", T0, attempt=2), RETRY, T0 + 5000, T0 + 5001)
    timings.record([failed])
    counts = timings._counts["q"]
    assert counts.count("lateness") == 0
    assert counts.count("duration") == 1 and counts.outcomes["retry"] == 0
    timings.count_failure(failed)  # a failure's outcome counts once its nack replied
    assert counts.outcomes["retry"] == 1


def test_remembered_retry_times_are_bounded() -> None:
    from django_delayqueue.core.timings import recorder

    timings = DeliveryTimings({})
    quadruples = [x for i in range(recorder.MAX_RETRY_TIMES + 50) for x in (f"m{i}", "t", i, "")]
    failed = [message(f"m{i}", T0) for i in range(recorder.MAX_RETRY_TIMES + 50)]
    timings.note_retries(_nack(quadruples), failed)
    assert len(timings._retry_times) == recorder.MAX_RETRY_TIMES
    assert ("q", "m0") not in timings._retry_times
    assert timings._retry_times[("q", "m10049")] == (10049, 2)
    # Read from the call nack_call builds: the retry-at it sends (-1, to garbage: not kept).
    q = _queue()
    r, d = message("r", T0), message("d", T0)
    timings.note_retries(q.nack_call([(r, 2.5, "again")], T0), [r])
    timings.note_retries(q.nack_call([(d, None, "dead")], T0, bury=True), [d])
    assert timings._retry_times[("q", "r")] == (T0 + 2500, 2)
    assert ("q", "d") not in timings._retry_times


def _queue() -> Any:
    from django_delayqueue.core import ManualClock, Queue

    return Queue(redis.Redis(), "q", clock=ManualClock(T0))  # builds calls, never sends them


def _nack(quadruples: list[Any]) -> Any:
    return _queue().nack_call([], T0)._replace(args=[T0, 5, 0, "w", *quadruples])


def test_a_timings_key_of_another_type_fails_the_flush_and_changes_nothing(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    from django_delayqueue.core.scripts.contracts import RECORD_TIMINGS

    q = make_queue()
    minute = q.keys.timings_minute(1)
    redis_client.set(minute, "not a hash")
    call = RECORD_TIMINGS.call(q.keys, minute=minute, ttl_seconds=60, increments=["l0", 1])
    with pytest.raises(Exception, match="WRONGTYPE"):
        call.run(redis_client)
    assert redis_client.exists(q.keys.timings) == 0  # the totals were not touched either
    assert redis_client.get(minute) == b"not a hash"


def test_handlers_stopped_by_a_limit_an_abort_or_a_stop_count_as_stopped() -> None:
    from django_delayqueue.core.journal import GARBAGE
    from django_delayqueue.core.timings.recorder import outcome_kind

    m = message("a", T0)
    time_limit = Outcome(m, RETRY, T0, T0, error="TimeLimitExceeded", reason="time limit")
    aborted = Outcome(m, GARBAGE, T0, T0, error="Aborted", reason="aborted by staff")
    consumer_stop = Outcome(m, RETRY, T0, T0, reason="handler stopped: SystemExit()")
    assert {outcome_kind(o, None) for o in (time_limit, aborted, consumer_stop)} == {"stopped"}
    assert outcome_kind(Outcome(m, GARBAGE, T0, T0, error="Reject"), None) == "dead"
    assert outcome_kind(Outcome(m, RETRY, T0, T0, error="ValueError"), None) == "retry"


# --- review r2: the limit wait of claims after a hold has ended ----------------------------------


def _claim_reply(*messages: tuple[str, int]) -> list[Any]:
    from django_delayqueue.core.envelope import encode_envelope

    return [
        part
        for message_id, due in messages
        for part in (message_id, encode_envelope('"x"', due, due), 1, f"tok-{message_id}")
    ]


def test_a_hold_ended_by_a_promote_does_not_keep_counting_limit_waits() -> None:
    """A hold on a slot (max_in_flight) ended by a promote (FlowHolds.promoted): a message
    claimed late much later, with no limit holding the queue (its claim says no wait), is
    late, not waiting on a limit: the consumer no longer counts waits of its own."""
    from django_delayqueue.core import ManualClock, Queue, QueueSettings
    from django_delayqueue.core.consumer.loop import Consumer

    settings = QueueSettings(max_in_flight=1)
    q = Queue(redis.Redis(), "q", clock=ManualClock(T0), settings=settings)  # calls never sent
    consumer = Consumer([q], lambda m: None)
    trip = consumer._round_trip
    plan = [(q, "promote", 0), (q, "claim", 1)]
    nothing_moved, moved = [0, 0, -1, 1], [1, 0, -1, 1]
    # T0: a claim held back until a slot frees (max_in_flight).
    trip._read_queue_results(plan, [nothing_moved, [-1]], T0)
    assert trip.holds.holds("q")
    # T0 + 100: a message reached ready (the hold on the slot is dropped), the claim takes one.
    trip._read_queue_results(plan, [moved, _claim_reply(("a", T0 + 50))], T0 + 100)
    assert not trip.holds.holds("q")
    # An hour later, nothing holds the queue: a message claimed 1 s after its due time (busy
    # handlers) did not wait on a limit, and its lateness must say so.
    hour = T0 + 3_600_000
    claimed, _ = trip._read_queue_results(
        plan, [nothing_moved, _claim_reply(("b", hour))], hour + 1000
    )
    (late,) = claimed
    assert late.limit_wait_ms == 0
    timings = consumer._unrecorded.timings
    timings.record([Outcome(late, ACK, hour + 1000, hour + 1001)])
    assert timings._counts["q"].histograms["lateness"][bucket_of(1000)] == 1


def test_a_retry_time_is_not_read_for_a_later_attempt_another_consumer_retried() -> None:
    """This consumer nacked attempt 1 (retry at T0 + 1 s); attempt 2 ran on another consumer,
    which retried it a minute later; attempt 3 runs here. Its due time (the other consumer's
    retry time) is unknown here: its lateness is left out, not read against attempt 2's retry
    time (a minute of backoff and a whole attempt counted as lateness)."""
    timings = DeliveryTimings({})
    first = message("r", T0)
    timings.note_retries(_queue().nack_call([(first, 1.0, "again")], T0), [first])
    third = Message("r", "q", None, T0, T0, 3, "t3", 0)  # attempt 3, claimed by us
    timings.record([Outcome(third, ACK, T0 + 61_005, T0 + 61_006)])
    counts = timings._counts["q"]
    assert counts.count("lateness") == 0, counts.histograms["lateness"]
    assert counts.count("duration") == 1


def test_a_retrys_limit_wait_starts_at_its_retry_time_not_its_first_due_time(
    make_queue: Any, manual_clock: Any
) -> None:
    """A queue held back by its rate limit since T0 (a backlog); a retry due again at
    T0 + 50 s is claimed at T0 + 120 s: it waited 70 s on the limit, not the 120 s since the
    hold began (its first due time, long before, is not when it became due)."""
    q = make_queue(rate_limit="1/m", backoff_base=50, backoff_max=50)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(2)])
    (first,) = q.claim(5)  # T0: the one token; m1 waits on the rate from here
    assert q.claim(5) == []
    q.nack(first, delay=50.0)  # back to ready at T0 + 50 s (ready_since), behind m1
    manual_clock.advance(ms=50_000)
    q.promote()
    manual_clock.advance(ms=10_000)
    (waited,) = q.claim(5)  # T0 + 60 s: the next token
    assert (waited.id, waited.limit_wait_ms) == ("m1", 60_000)
    manual_clock.advance(ms=60_000)
    (retry,) = q.claim(5)  # T0 + 120 s
    assert (retry.id, retry.attempt, retry.limit_wait_ms) == ("m0", 2, 70_000)


def test_a_key_limited_queue_counts_its_wait_apart_too(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """The wait a key limit imposed is taken off the lateness (the claims said "held"), so it
    must be counted as limit wait, as a rate_limit's is: not lost from both."""
    q = make_queue(clock=SystemClock(), key_rate_limit="20/s", concurrency=2)
    q.schedule_many([{"payload": i, "key": "A"} for i in range(6)])
    burst([q], lambda m: None)
    got = totals(redis_client, q)
    assert got.count("lateness") == 6
    assert got.count("limit_wait") == 6
    # One start of key A per 50 ms: the i-th message waits about 50 * (i - 1) ms on the limit.
    assert got.sums["limit_wait"] >= 50 * (1 + 2 + 3 + 4 + 5) - 5 * 5


def test_a_limit_wait_belongs_to_its_queues_delivery_not_another_with_the_same_token() -> None:
    """Tokens count per queue (claim.lua's seq: "1", "2", ...), so two queues of a consumer,
    or two shards of a queue, hand out the same tokens: queue a's limit wait is not queue b's
    delivery's, whose lateness is its own."""
    timings = DeliveryTimings({})
    waited = replace(message("1", T0, queue="a"), limit_wait_ms=500)  # on a's limit
    other = message("1", T0, queue="b")  # token "1" of queue b: 300 ms late, no limit
    timings.record([Outcome(other, ACK, T0 + 300, T0 + 301)])
    assert timings._counts["b"].histograms["lateness"][bucket_of(300)] == 1
    timings.record([Outcome(waited, ACK, T0 + 510, T0 + 511)])  # 10 ms late once claimed
    assert timings._counts["a"].histograms["lateness"][bucket_of(10)] == 1


def test_a_retry_time_is_its_queues_not_another_queues_message_of_the_same_id() -> None:
    """Message ids are the caller's (``id="order-42"``): two queues may each have one. Queue
    a's retry time is not the due time of queue b's second attempt of its own "x"."""
    timings = DeliveryTimings({})
    in_a = message("x", T0, queue="a")
    timings.note_retries(_queue().nack_call([(in_a, 1.0, "again")], T0), [in_a])
    in_b = Message("x", "b", None, T0, T0, 2, "t", 0)  # retried by another consumer
    timings.record([Outcome(in_b, ACK, T0 + 30_000, T0 + 30_001)])
    assert timings._counts["b"].count("lateness") == 0


def test_a_requeued_dead_letter_is_not_late_from_its_first_due_time(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    """Staff requeue a dead letter a day after it died: requeue.lua gives it fresh attempts
    and counts it overdue from now (ready_since), not from its envelope's due time. Its
    start lateness must not be a day (every requeue of a backlog would fill the +Inf bucket,
    flag the queue and fail the health probe)."""
    q = make_queue(max_attempts=1)
    q.schedule("x", id="x")

    def handler(m: Message) -> None:
        if m.attempt == 1 and manual_clock.now_ms() == T0:
            raise Reject("bug")

    burst([q], handler)
    manual_clock.advance(ms=86_400_000)
    assert q.requeue("x") == 1
    burst([q], handler)
    got = totals(redis_client, q)
    assert got.outcomes["dead"] == 1 and got.outcomes["ack"] == 1
    assert got.histograms["lateness"][-1] == 0, "a day late"


def test_a_held_claim_gives_its_hold_and_when_its_messages_came_back(
    make_queue: Any, manual_clock: Any
) -> None:
    """claim.lua's reply: quadruples, a limit's "come back at", then the ready_since of the
    messages that came back (the trailing table): each part read as what it is, so a hold
    still holds and the requeued message's lateness counts from its requeue."""
    q = make_queue(max_attempts=1, max_in_flight=1)
    q.schedule("a", id="a")
    q.schedule("b", id="b")
    burst([q], lambda m: (_ for _ in ()).throw(Reject("bug")))
    manual_clock.advance(ms=60_000)
    assert q.requeue("a", "b") == 2
    now = manual_clock.now_ms()
    raw = q.claim_call(now, 5).run(q.client)
    assert q.claim_hold(raw) == -1  # the slot is taken: held until a delivery ends
    (m,) = q.claimed(raw, now)
    assert m.attempt == 1 and m.ready_since_ms == T0 + 60_000
    timings = DeliveryTimings({})
    timings.record([Outcome(m, ACK, now + 3, now + 4)])
    assert timings._counts[q.name].histograms["lateness"][bucket_of(3)] == 1
