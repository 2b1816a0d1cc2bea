"""Queue.schedule, schedule_many and promote against the real server (core.queue, Lua)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from memory_support import fill, full, make_room

from django_delayqueue.core import PayloadError, Queue, ScheduleResult
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.queue import ANNOUNCE_WITHIN_MS

T0 = 1_700_000_000_000


def envelope(client: redis.Redis, q: Queue, message_id: str) -> dict[str, Any]:
    """The stored envelope of ``message_id`` as ``{"d": due, "s": scheduled, "p": payload}``."""
    raw = client.hget(q.keys.messages, message_id)
    assert raw is not None, f"no envelope for {message_id}"
    due, scheduled, payload = decode_envelope(raw)
    return {"d": due, "s": scheduled, "p": payload}


def ready_ids(client: redis.Redis, q: Queue) -> list[str]:
    return [i.decode() for i in client.lrange(q.keys.ready, 0, -1)]


# --- schedule -------------------------------------------------------------------------------------


def test_future_message_waits_in_pending_with_its_due_time(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    result = q.schedule({"order": 42}, delay=30, id="close-42")
    assert result == ScheduleResult("close-42", True, T0 + 30_000)
    assert redis_client.zscore(q.keys.pending, "close-42") == T0 + 30_000
    assert envelope(redis_client, q, "close-42") == {"d": T0 + 30_000, "s": T0, "p": {"order": 42}}
    assert redis_client.llen(q.keys.ready) == 0
    assert q.counts()["pending"] == 1


def test_due_now_goes_straight_to_ready(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("now", id="a")
    q.schedule("zero", delay=0, id="b")
    q.schedule("past", at=T0 - 5_000, id="c")
    assert ready_ids(redis_client, q) == ["a", "b", "c"]
    assert redis_client.zcard(q.keys.pending) == 0
    assert envelope(redis_client, q, "c")["d"] == T0 - 5_000


def test_delay_accepts_timedelta_and_at_accepts_aware_datetime(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    assert q.schedule(1, delay=timedelta(minutes=2)).due_ms == T0 + 120_000
    at = datetime.fromtimestamp((T0 + 5_000) / 1000, tz=timezone.utc)
    assert q.schedule(2, at=at).due_ms == T0 + 5_000
    assert q.schedule(3, at=T0 + 7, id="ms").due_ms == T0 + 7  # epoch milliseconds
    assert redis_client.zscore(q.keys.pending, "ms") == T0 + 7


@pytest.mark.parametrize(
    "kwargs,problem",
    [
        ({"delay": 1, "at": T0}, "not both"),
        ({"delay": -1}, "zero or more seconds"),
        ({"delay": float("nan")}, "zero or more seconds"),
        ({"at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"at": "tomorrow"}, "aware datetime or epoch milliseconds"),
        ({"id": ""}, "message id"),
        ({"id": 7}, "message id"),
    ],
)
def test_bad_arguments_are_refused_and_nothing_is_written(
    redis_client: redis.Redis, make_queue: Any, kwargs: dict, problem: str
) -> None:
    q = make_queue()
    with pytest.raises(PayloadError, match=problem):
        q.schedule("x", **kwargs)
    assert redis_client.dbsize() == 0


def test_non_json_payload_is_refused_and_nothing_is_written(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    with pytest.raises(PayloadError, match="payload is not JSON-serialisable"):
        q.schedule({"when": datetime.now(tz=timezone.utc)}, id="x")
    with pytest.raises(PayloadError, match="JSON-serialisable"):
        q.schedule(object())
    assert redis_client.dbsize() == 0


def test_oversized_payload_is_refused_naming_the_limit(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(max_payload_bytes=1024)
    with pytest.raises(PayloadError, match="over the 1024-byte limit"):
        q.schedule("x" * 1024, id="big")
    assert redis_client.dbsize() == 0
    assert q.schedule("x" * 1022, id="fits").created  # 1024 bytes with its quotes


def test_second_schedule_of_a_waiting_id_changes_nothing(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    first = q.schedule({"v": 1}, delay=60, id="dup")
    before = (envelope(redis_client, q, "dup"), redis_client.zscore(q.keys.pending, "dup"))
    manual_clock.advance(5)
    again = q.schedule({"v": 2}, delay=1, id="dup")
    assert first.created and not again.created
    assert again.id == "dup"
    assert (envelope(redis_client, q, "dup"), redis_client.zscore(q.keys.pending, "dup")) == before
    assert q.counts() == {"pending": 1, "ready": 0, "unack": 0, "retry": 0, "garbage": 0}


def test_second_schedule_of_a_ready_or_running_id_is_not_a_new_message(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("first", id="x")
    assert not q.schedule("second", id="x").created
    assert ready_ids(redis_client, q) == ["x"]
    (m,) = q.claim()
    assert not q.schedule("third", id="x").created
    assert m.payload == "first" and q.counts()["ready"] == 0
    q.ack(m)
    assert q.schedule("after ack", id="x").created  # a finished id may be used again


def test_payloads_never_get_a_ttl(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue(max_attempts=1)
    q.schedule("later", delay=100, id="p")
    q.schedule_many([{"payload": i} for i in range(5)])
    claimed = q.claim(3)
    q.nack(claimed[0], delay=10)
    q.bury(claimed[1], "dead")
    q.snapshot()
    keys = redis_client.keys("*")
    assert {q.keys.pending, q.keys.messages, q.keys.garbage, q.keys.unack} <= {
        k.decode() for k in keys
    }
    assert {k.decode(): redis_client.ttl(k) for k in keys} == {k.decode(): -1 for k in keys}


# --- wake publication -----------------------------------------------------------------------------


@pytest.fixture
def wake(redis_client: redis.Redis, make_queue: Any) -> Any:
    q = make_queue()
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(q.keys.wake_channel)
    assert pubsub.get_message(timeout=5) is None  # consume the subscribe confirmation

    def next_wake(timeout: float) -> str | None:
        message = pubsub.get_message(timeout=timeout)
        return message["data"].decode() if message else None

    yield q, next_wake
    pubsub.close()


def test_schedule_wakes_consumers_for_an_earlier_message_only(wake: Any) -> None:
    q, next_wake = wake
    assert next_wake(0.1) is None
    q.schedule("a", delay=1.5)
    assert next_wake(5) == str(T0 + 1_500)  # first pending message: earliest by definition
    q.schedule("b", delay=1.0)
    assert next_wake(5) == str(T0 + 1_000)
    q.schedule("c", delay=1.2)  # later than b: a sleeping consumer already wakes in time
    assert next_wake(0.3) is None
    q.schedule("d", delay=1.0)
    assert next_wake(0.3) is None  # equal, not earlier


def test_a_message_due_beyond_the_announce_horizon_is_not_announced(wake: Any) -> None:
    # Consumers read the pending head at least every ANNOUNCE_WITHIN_MS: no need to wake them.
    q, next_wake = wake
    q.schedule("far", delay=ANNOUNCE_WITHIN_MS / 1000 + 0.001)
    assert next_wake(0.3) is None
    q.schedule("near", delay=ANNOUNCE_WITHIN_MS / 1000)
    assert next_wake(5) == str(T0 + ANNOUNCE_WITHIN_MS)


def test_due_now_message_wakes_consumers(wake: Any) -> None:
    q, next_wake = wake
    q.schedule("a", delay=1)
    assert next_wake(5) == str(T0 + 1_000)
    q.schedule("now")
    assert next_wake(5) == str(T0)


def test_duplicate_schedule_does_not_wake(wake: Any) -> None:
    q, next_wake = wake
    q.schedule("a", delay=1, id="a")
    assert next_wake(5) is not None
    q.schedule("a", delay=0.5, id="a")
    assert next_wake(0.3) is None


def test_schedule_many_publishes_once_per_call_with_the_earliest(wake: Any) -> None:
    q, next_wake = wake
    q.schedule_many(
        [{"payload": 1, "delay": 1.5}, {"payload": 2, "delay": 0.5}, {"payload": 3, "delay": 60}]
    )
    assert next_wake(5) == str(T0 + 500)
    assert next_wake(0.3) is None


# --- schedule_many --------------------------------------------------------------------------------


def test_schedule_many_counts_already_present_and_rejects_bad_items(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(max_payload_bytes=100)
    q.schedule("old", id="exists", delay=5)
    items = [
        {"payload": 1, "id": "a"},
        {"payload": 2, "id": "exists"},
        {"payload": object(), "id": "bad-json"},
        {"payload": "x" * 200, "id": "too-big"},
        {"payload": 3, "id": "a"},  # duplicate within the batch
        {"payload": 4, "delay": 10},
        {"payload": 5, "delay": 1, "at": T0},
    ]
    result = q.schedule_many(items, chunk_size=2)
    assert (result.scheduled, result.already_present) == (2, 2)
    assert [(r.index, r.id) for r in result.rejected] == [
        (2, "bad-json"),
        (3, "too-big"),
        (6, None),
    ]
    assert "JSON-serialisable" in result.rejected[0].reason
    assert "100-byte limit" in result.rejected[1].reason
    assert not redis_client.hexists(q.keys.messages, "bad-json")
    assert not redis_client.hexists(q.keys.messages, "too-big")
    assert envelope(redis_client, q, "a")["p"] == 1
    assert envelope(redis_client, q, "exists")["p"] == "old"
    assert q.counts() == {"pending": 2, "ready": 1, "unack": 0, "retry": 0, "garbage": 0}


def test_schedule_many_of_a_generator_larger_than_one_pipeline(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    result = q.schedule_many(({"payload": i, "id": f"m{i}"} for i in range(250)), chunk_size=10)
    assert (result.scheduled, result.already_present, result.rejected) == (250, 0, [])
    assert ready_ids(redis_client, q) == [f"m{i}" for i in range(250)]


def test_schedule_many_reports_what_a_full_redis_refused_and_sends_no_more(
    redis_client: redis.Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue()
    real = q.scheduling.schedule_one.call_many
    pipelines: list[int] = []

    def then_full(calls: Any, **kwargs: Any) -> Any:
        replies = real(calls, **kwargs)
        pipelines.append(len(calls))
        fill(redis_client)  # memory is full from the second pipeline on
        return replies

    monkeypatch.setattr(q.scheduling.schedule_one, "call_many", then_full)
    items: list[dict[str, Any]] = [{"payload": i, "id": f"m{i}"} for i in range(200)]
    items.insert(100, {"payload": object(), "id": "bad"})
    try:
        result = q.schedule_many(items, chunk_size=10)  # 8 chunks of 10 a pipeline
    finally:
        make_room(redis_client)
    assert pipelines == [8, 8]  # the third was never sent
    assert (result.scheduled, result.already_present) == (80, 0)
    assert [(r.index, r.id) for r in result.rejected] == [(100, "bad")]
    expected = [(i, f"m{i}") for i in range(80, 100)] + [(i + 1, f"m{i}") for i in range(100, 200)]
    assert [(r.index, r.id) for r in result.not_scheduled] == expected
    assert "out of memory" in result.not_scheduled[0].reason
    assert ready_ids(redis_client, q) == [f"m{i}" for i in range(80)]  # nothing else stored
    assert redis_client.hlen(q.keys.messages) == 80


def test_schedule_prepared_reports_the_indexes_refused_for_memory(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    prepared = [q.prepare({"n": i}, id=f"p{i}") for i in range(3)]
    with full(redis_client):
        result = q.schedule_prepared(prepared)
    assert result.scheduled == 0
    assert [(r.index, r.id) for r in result.not_scheduled] == [(0, "p0"), (1, "p1"), (2, "p2")]
    assert q.schedule_prepared(prepared).scheduled == 3  # sent again once there is room


def test_schedule_prepared_uses_the_same_script(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    prepared = [q.prepare({"n": i}, delay=i, id=f"p{i}") for i in range(3)]
    assert q.schedule_prepared(prepared).scheduled == 3
    assert q.schedule_prepared(prepared).already_present == 3
    assert redis_client.zscore(q.keys.pending, "p2") == T0 + 2_000
    assert ready_ids(redis_client, q) == ["p0"]


# --- promote --------------------------------------------------------------------------------------


def test_promote_moves_only_due_messages_in_due_order(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("c", delay=3, id="c")
    q.schedule("a", delay=1, id="a")
    q.schedule("b", delay=2, id="b")
    assert q.promote().moved == 0
    manual_clock.advance(2)
    result = q.promote()
    assert (result.moved, result.more, result.next_due_ms) == (2, False, T0 + 3_000)
    assert ready_ids(redis_client, q) == ["a", "b"]
    assert q.promote(now_ms=T0 + 3_000).next_due_ms is None
    assert ready_ids(redis_client, q) == ["a", "b", "c"]


def test_promote_at_exactly_the_due_time(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", delay=1, id="x")
    assert q.promote(now_ms=T0 + 999).moved == 0
    assert q.promote(now_ms=T0 + 1_000).moved == 1


def test_promote_moves_due_retries_and_clears_their_token(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m,) = q.claim()
    q.nack(m, delay=5)
    assert redis_client.hget(q.keys.tokens, "x") == m.token.encode()
    manual_clock.advance(5)
    assert q.promote().moved == 1
    assert ready_ids(redis_client, q) == ["x"]
    assert not redis_client.hexists(q.keys.tokens, "x")
    assert q.ack(m) == 0  # the old delivery can no longer touch the message


def test_bounded_promote_of_a_100k_backlog(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    result = q.schedule_many({"payload": i, "delay": 1 + i % 7} for i in range(100_000))
    assert result.scheduled == 100_000
    manual_clock.advance(10)
    calls = []
    while len(calls) < 200:  # a bound in case `more` never turns False
        calls.append(q.promote(limit=1000))
        if not calls[-1].more:
            break
    assert len(calls) == 100
    assert all(c.more for c in calls[:-1]) and not calls[-1].more
    assert all(c.moved <= 1000 for c in calls)
    assert sum(c.moved for c in calls) == 100_000
    assert redis_client.llen(q.keys.ready) == 100_000
    assert redis_client.zcard(q.keys.pending) == 0


def test_promote_limit_applies_to_pending_and_retry(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    for i in range(3):
        q.schedule(i, id=f"r{i}")
    for m in q.claim():
        q.nack(m, delay=1)
    q.schedule_many({"payload": i, "delay": 1} for i in range(3))
    manual_clock.advance(1)
    first = q.promote(limit=2)
    assert (first.moved, first.more) == (4, True)
    second = q.promote(limit=2)
    assert (second.moved, second.more) == (2, False)
    assert redis_client.llen(q.keys.ready) == 6
