"""What callers hand a Queue (core.queue): delays and at= turned into due times that are never
early, and values that cannot be due times refused as PayloadError (one bad item of a bulk
schedule is reported, not raised)."""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
import redis

from django_delayqueue.core import (
    ManualClock,
    Message,
    PayloadError,
    Queue,
    RedisClock,
    Retry,
    SystemClock,
)
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import RETRY, run_handler
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.queue import MAX_DUE_MS

T0 = 1_700_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class TwoReadingClock:
    """A clock whose producers' reading is ahead of its consumers' (a 3.7 ms round trip)."""

    def __init__(self, lower: float, upper: float) -> None:
        self.lower, self.upper = lower, upper

    def now_ms(self) -> int:
        return math.floor(self.lower)

    def now_exact_ms(self) -> float:
        return self.lower

    def now_upper_ms(self) -> float:
        return self.upper


# --- due times are rounded up, never down ------------------------------------------------------


def test_a_delay_counts_from_the_exact_reading_and_rounds_up(make_queue: Any) -> None:
    q = make_queue(clock=ManualClock(T0 + 0.4))
    # Before: the reading was floored to T0 and T0 + 290 was 0.4 ms before the instant asked.
    assert q.prepare("x", delay=0.29)[1] == T0 + 291
    assert q.schedule("x", delay=0.29).due_ms == T0 + 291
    assert q.schedule("x", delay=timedelta(milliseconds=290)).due_ms == T0 + 291


@pytest.mark.parametrize(
    "delay,due",
    [
        (0.29, 290),  # 0.29 * 1000 is 290.00000000000006: not 291
        (0.1 + 0.2, 300),  # 0.30000000000000004 s
        (1.001, 1001),
        (Decimal("0.29"), 290),
        (timedelta(milliseconds=290), 290),
        (0.0005, 1),  # half a millisecond is not due at once: rounded up
        (timedelta(microseconds=1), 1),
        (0.0015, 2),
    ],
)
def test_float_noise_does_not_add_a_millisecond(make_queue: Any, delay: Any, due: int) -> None:
    q = make_queue(clock=ManualClock(0))
    assert q.prepare("x", delay=delay)[1] == due


def test_producers_count_from_the_clock_reading_that_is_never_behind(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    # The consumers' reading may be a round trip behind the server; a due time counted from it
    # was that much early. Queue.schedule and schedule_many pass that reading as now_ms.
    q = make_queue(clock=TwoReadingClock(lower=T0, upper=T0 + 3.7))
    assert q.prepare("x", delay=1)[1] == T0 + 1004
    assert q.schedule("one", delay=1, id="one").due_ms == T0 + 1004
    q.schedule_many([{"payload": "many", "delay": 1, "id": "many"}])
    assert redis_client.zscore(q.keys.pending, "many") == T0 + 1004
    due, scheduled, _ = decode_envelope(redis_client.hget(q.keys.messages, "one"))
    assert (due, scheduled) == (T0 + 1004, T0)  # scheduled: the time it was sent


@pytest.mark.parametrize("delay", [None, 0, 0.0, timedelta(0)])
def test_no_delay_is_due_at_once_and_goes_straight_to_ready(
    redis_client: redis.Redis, make_queue: Any, delay: Any
) -> None:
    q = make_queue(clock=TwoReadingClock(lower=T0 + 0.4, upper=T0 + 3.7))
    assert q.schedule("now", delay=delay, id="now").due_ms == T0
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"now"]


@pytest.mark.parametrize(
    "at,due",
    [
        (datetime(2030, 1, 1, tzinfo=timezone.utc), 1_893_456_000_000),
        (datetime(2030, 1, 1, 0, 0, 0, 290_000, tzinfo=timezone.utc), 1_893_456_000_290),
        (datetime(2030, 1, 1, 0, 0, 0, 500, tzinfo=timezone.utc), 1_893_456_000_001),
        (datetime(2030, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))), 1_893_456_000_000),
        (1_893_456_000_000, 1_893_456_000_000),
        (1_893_456_000_000.5, 1_893_456_000_001),
        (1_893_456_000_290.0, 1_893_456_000_290),
    ],
)
def test_at_is_rounded_up_to_the_millisecond(make_queue: Any, at: Any, due: int) -> None:
    # Before: int(at.timestamp() * 1000) floored 500 us into the millisecond before.
    assert make_queue().prepare("x", at=at)[1] == due


def test_the_last_instant_of_year_9999_is_a_due_time(make_queue: Any) -> None:
    last = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=timezone.utc)
    assert make_queue().prepare("x", at=last)[1] == MAX_DUE_MS
    assert (datetime.max.replace(tzinfo=timezone.utc) - EPOCH) // timedelta(
        milliseconds=1
    ) + 1 == MAX_DUE_MS
    assert MAX_DUE_MS < 2**53  # every millisecond up to it is exact in a double


# --- values that cannot be due times ------------------------------------------------------------

BAD_DELAYS = [
    (math.inf, "finite"),
    (-math.inf, "finite"),
    (math.nan, "finite"),
    (Decimal("NaN"), "finite"),
    (1e300, "too long"),
    (10**400, "too long"),  # float() overflows
    (10**5000, "too long"),  # no repr past the int-string limit: the message must not raise
    (timedelta.max, "too long"),
    (MAX_DUE_MS / 1000, "too long"),  # not too long alone, but now + it is
    (-0.001, "zero or more"),
    (timedelta(microseconds=-1), "zero or more"),
    ("soon", "number of seconds"),
    ({"seconds": 5}, "number of seconds"),
    # Before: float() took these as 5 s, 1 s and 0 s.
    ("5", "number of seconds or a timedelta, not '5' \\(str\\)"),
    (b"5", "number of seconds or a timedelta, not b'5' \\(bytes\\)"),
    (True, "number of seconds or a timedelta, not True \\(bool\\)"),
    (False, "number of seconds or a timedelta, not False \\(bool\\)"),
]
BAD_ATS = [
    (math.inf, "finite"),
    (-math.inf, "finite"),
    (math.nan, "finite"),
    (1e300, "beyond year 9999"),
    (-1e300, "beyond year 9999"),
    (10**20, "beyond year 9999"),
    (MAX_DUE_MS + 1, "beyond year 9999"),
    (datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=5))), "beyond year 9999"),
    (datetime(2030, 1, 1), "timezone-aware"),
    ("2030-01-01", "aware datetime or epoch"),
    (True, "aware datetime or epoch"),
]


def _short(value: Any) -> str | None:
    if isinstance(value, int) and value.bit_length() > 10_000:
        return "huge-int"  # past the int-string limit: no repr
    return None if isinstance(value, str) else repr(value)[:24]


@pytest.mark.parametrize("delay,problem", BAD_DELAYS, ids=_short)
def test_a_delay_that_is_no_due_time_is_a_payload_error(
    make_queue: Any, delay: Any, problem: str
) -> None:
    # Before: inf raised OverflowError and 1e300 made a due time Redis stores rounded.
    with pytest.raises(PayloadError, match=problem):
        make_queue().schedule("x", delay=delay)


@pytest.mark.parametrize("at,problem", BAD_ATS, ids=_short)
def test_an_at_that_is_no_due_time_is_a_payload_error(
    make_queue: Any, at: Any, problem: str
) -> None:
    with pytest.raises(PayloadError, match=problem):
        make_queue().schedule("x", at=at)


def test_schedule_many_lists_bad_due_times_as_rejected_and_schedules_the_rest(
    make_queue: Any,
) -> None:
    q = make_queue()
    bad = [{"payload": n, "delay": d} for n, (d, _) in enumerate(BAD_DELAYS)]
    bad += [{"payload": n, "at": at} for n, (at, _) in enumerate(BAD_ATS)]
    items = [{"payload": "first", "delay": 1}, *bad, {"payload": "last", "at": T0 + 5}]
    # Before: the first infinite delay aborted the whole call with OverflowError.
    result = q.schedule_many(items)
    assert result.scheduled == 2
    assert [r.index for r in result.rejected] == list(range(1, len(items) - 1))
    assert q.counts()["pending"] == 2


@pytest.mark.parametrize(
    "delay,ms",
    [(5, 5_000), (2.5, 2_500), (Decimal("0.5"), 500), (Fraction(1, 4), 250), (timedelta(1), 864e5)],
    ids=_short,
)
def test_a_delay_is_a_number_of_seconds_or_a_timedelta(
    make_queue: Any, delay: Any, ms: float
) -> None:
    assert make_queue(clock=ManualClock(T0)).prepare("x", delay=delay)[1] == T0 + ms


# --- payloads that a consumer could not decode again ---------------------------------------------


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"child": [value]}
    return value


@pytest.mark.parametrize(
    "payload,problem",
    [
        # Before: accepted from a shallow stack, then RecursionError in the consumer's claim.
        (deep(495), "payload nests arrays and objects more than 200 levels deep"),
        # Before: UnicodeEncodeError (what os.fsdecode makes of an undecodable file name).
        ({"file": "r\udcffport.pdf"}, r"payload holds a lone surrogate '\\udcff' \(character 10"),
    ],
    ids=["too-deep", "surrogate"],
)
def test_a_payload_a_consumer_could_not_decode_is_refused_by_schedule(
    redis_client: redis.Redis, make_queue: Any, payload: Any, problem: str
) -> None:
    q = make_queue()
    with pytest.raises(PayloadError, match=problem):
        q.schedule(payload, id="x")
    with pytest.raises(PayloadError, match=problem):
        q.schedule(payload, id="x", replace=True)
    assert redis_client.hlen(q.keys.messages) == 0


def test_schedule_many_reports_undecodable_payloads_as_rejected_and_stores_the_rest(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    items: list[Any] = [{"payload": n, "id": f"m{n}"} for n in range(4_000)]
    items.insert(10, {"payload": deep(101), "id": "deep"})
    items += [{"payload": "\udcff", "id": "surrogate"}, "not a mapping"]
    # Before: the surrogate raised UnicodeEncodeError after 4,000 were stored (no BulkResult).
    result = q.schedule_many(items)
    assert result.scheduled == 4_000 and redis_client.hlen(q.keys.messages) == 4_000
    rejected = {r.index: (r.id, r.reason) for r in result.rejected}
    assert sorted(rejected) == [10, 4_001, 4_002]
    assert rejected[10][0] == "deep" and "more than 200 levels deep" in rejected[10][1]
    assert rejected[4_001][0] == "surrogate" and "lone surrogate" in rejected[4_001][1]
    assert rejected[4_002] == (None, "item must be a mapping with a payload, not a str")


# --- end to end: no handler starts before the instant asked for -------------------------------


@pytest.mark.parametrize("clock_kind", ["system", "redis"])
def test_no_handler_starts_before_the_instant_the_caller_asked_for(
    redis_client: redis.Redis, clock_kind: str
) -> None:
    """Hundreds of deliveries with sub-millisecond delays, each start read with time.time().

    This checks order, not speed: however late a start is (a loaded machine), it must not be
    before ``time.time()`` at the call plus the delay. Before the fix about half were early by
    up to a millisecond (due times floored, producers on the never-ahead reading).
    """
    clock = SystemClock() if clock_kind == "system" else RedisClock(redis_client)
    q = Queue(redis_client, "never-early", clock=clock)
    count = 300
    asked: dict[int, float] = {}
    started: dict[int, float] = {}
    done = threading.Event()

    def handler(message: Message) -> None:
        started[message.payload] = time.time()
        if len(started) == count:
            done.set()

    consumer = Consumer([q], handler, concurrency=4, idle_seconds=0.5)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        for n in range(count):
            delay = 0.02 + n * 0.00113  # every fraction of a millisecond, over ~0.36 s
            before = time.time()
            q.schedule(n, delay=delay)
            asked[n] = before + delay
        assert done.wait(60), f"only {len(started)} of {count} delivered"
    finally:
        consumer.request_stop()
        thread.join(30)
    early = {n: asked[n] - started[n] for n in range(count) if started[n] < asked[n]}
    assert early == {}


# --- retry delays: checked where they are raised, clamped where they are recorded -------------

BAD_RETRY_DELAYS = [math.inf, -math.inf, math.nan, -1, 1e300, 10**400, "5", True, [1]]


@pytest.mark.parametrize("delay", BAD_RETRY_DELAYS, ids=_short)
def test_retry_refuses_a_delay_that_is_no_retry_time(delay: Any) -> None:
    with pytest.raises(ValueError, match="Retry delay must be") as raised:
        Retry(delay=delay)
    assert repr(delay)[:10] in str(raised.value)  # names the bad value


@pytest.mark.parametrize(
    "delay,seconds",
    [(None, None), (0, 0.0), (7.5, 7.5), (Decimal("2.5"), 2.5), (timedelta(minutes=2), 120.0)],
)
def test_retry_keeps_a_good_delay_in_seconds(delay: Any, seconds: float | None) -> None:
    assert Retry(delay=delay).delay == seconds


def test_a_handler_raising_a_bad_retry_fails_like_any_other_error() -> None:
    def handler(message: Message) -> None:
        raise Retry(delay=math.inf, reason="later")

    message = Message("m", "q", None, T0, T0, 1, "token", T0)
    outcome = run_handler(handler, message, T0)
    # An ordinary failure: retried with the queue's backoff, the error in the journal.
    assert (outcome.status, outcome.delay, outcome.error) == (RETRY, None, "ValueError")
    assert "inf" in outcome.reason


class UncheckedRetry(Retry):
    """A Retry whose delay was not checked (a subclass, or one built before the check)."""

    def __init__(self, delay: Any) -> None:
        Exception.__init__(self, "unchecked")
        self.delay, self.reason = delay, "unchecked"


@pytest.mark.parametrize(
    "delay,retry_in_ms",
    [
        (math.inf, 300_000),  # backoff_max
        (math.nan, 300_000),
        (1e300, 300_000),
        (10**400, 300_000),
        ("soon", 300_000),
        (-5, 0),
        (-math.inf, 0),
        (2.5, 2_500),
        (0.0015, 2),  # rounded up, as due times are
        (3600.0, 3_600_000),  # longer than backoff_max: asked for, so kept
    ],
    ids=_short,
)
def test_nack_arguments_are_always_sane_integers(
    redis_client: redis.Redis, make_queue: Any, delay: Any, retry_in_ms: int
) -> None:
    q = make_queue(backoff_max=300)
    q.schedule("x", id="x")
    (message,) = q.claim()
    args = q.nack_call([(message, delay, "failed")], now_ms=T0).args
    # now, max attempts, announce horizon, wake channel, then id, token, retry-at, reason
    assert args[:2] == [T0, 5] and args[3] == q.keys.wake_channel
    assert args[4:8] == ["x", message.token, T0 + retry_in_ms, "failed"]
    # Before: inf raised OverflowError here, so the outcome could never be recorded.
    assert q.nack(message, delay=delay, reason="failed") == 1
    assert redis_client.zscore(q.keys.retry, "x") == T0 + retry_in_ms


def test_a_consumer_survives_a_handler_outcome_with_an_unusable_delay(make_queue: Any) -> None:
    q = make_queue(backoff_max=60)
    for n in range(3):
        q.schedule(n, id=f"m{n}")

    def handler(message: Message) -> None:
        if message.payload == 1:
            raise UncheckedRetry(math.inf)

    consumer = Consumer([q], handler, burst=True)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert q.counts()["retry"] == 1 and q.counts()["unack"] == 0  # the others acked
