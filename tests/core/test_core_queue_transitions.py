"""Claim, ack, nack, reap, extend and release against the real server, on a ManualClock."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayqueue.core import Message

T0 = 1_700_000_000_000
EMPTY = {"pending": 0, "ready": 0, "unack": 0, "retry": 0, "garbage": 0}


def gone(client: redis.Redis, q: Any, message_id: str) -> bool:
    """Nothing of the message is left anywhere in Redis."""
    k = q.keys
    in_zsets = any(client.zscore(z, message_id) is not None for z in (k.pending, k.unack, k.retry))
    in_ready = message_id.encode() in client.lrange(k.ready, 0, -1)
    in_hashes = any(
        client.hexists(h, message_id) for h in (k.messages, k.attempts, k.tokens, k.reasons)
    )
    return not (in_zsets or in_ready or in_hashes or client.zscore(k.garbage, message_id))


# --- claim ----------------------------------------------------------------------------------------


def test_claim_of_a_batch(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue(visibility_timeout=30)
    q.schedule_many([{"payload": {"n": i}, "id": f"m{i}"} for i in range(5)])
    claimed = q.claim(3)
    assert [m.id for m in claimed] == ["m0", "m1", "m2"]  # oldest first
    assert [m.payload for m in claimed] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(m.attempt == 1 and m.queue == "q" for m in claimed)
    assert all(m.due_ms == T0 and m.scheduled_ms == T0 and m.claimed_ms == T0 for m in claimed)
    assert len({m.token for m in claimed}) == 3
    deadlines = dict(redis_client.zrange(q.keys.unack, 0, -1, withscores=True))
    assert deadlines == {f"m{i}".encode(): T0 + 30_000 for i in range(3)}
    assert q.counts() == {**EMPTY, "ready": 2, "unack": 3}
    rest = q.claim(10)
    assert [m.id for m in rest] == ["m3", "m4"]
    assert not {m.token for m in rest} & {m.token for m in claimed}
    assert q.claim(10) == []


def test_claim_uses_the_batch_size_setting(make_queue: Any) -> None:
    q = make_queue(claim_batch=2)
    q.schedule_many([{"payload": i} for i in range(5)])
    assert len(q.claim()) == 2


def test_claim_skips_pending_messages(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("later", delay=1)
    assert q.claim() == []


def test_corrupt_envelopes_go_to_garbage_and_claim_returns_the_good_ones(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule_many([{"payload": n, "id": n} for n in ("good1", "bad-json", "missing", "shape")])
    q.schedule("good2", id="good2")
    redis_client.hset(q.keys.messages, "bad-json", b"{this is not json")
    redis_client.hdel(q.keys.messages, "missing")
    redis_client.hset(q.keys.messages, "shape", b'["valid", "json", "wrong shape"]')
    claimed = q.claim(10)
    assert [m.payload for m in claimed] == ["good1", "good2"]
    dead = {i.decode() for i in redis_client.zrange(q.keys.garbage, 0, -1)}
    assert dead == {"bad-json", "missing", "shape"}
    reasons = {k.decode(): v.decode() for k, v in redis_client.hgetall(q.keys.reasons).items()}
    assert all(reasons[i].startswith("corrupt") for i in dead)
    assert "not JSON" in reasons["bad-json"]
    assert "missing" in reasons["missing"]
    assert "does not start with hex due and lead times" in reasons["shape"]
    assert q.counts() == {**EMPTY, "unack": 2, "garbage": 3}
    # The bad ones are no longer in flight: a reap later does not bring them back.
    assert q.ack(*claimed) == 2
    assert q.reap(now_ms=T0 + 10**9).retried == 0
    assert q.counts() == {**EMPTY, "garbage": 3}


def test_an_envelope_of_a_later_releases_format_is_left_for_a_newer_consumer_never_buried(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """What a later release's producer writes (its format's number after the times, then
    anything): not corrupt, so not a dead letter (docs/upgrades.md)."""
    q = make_queue()
    q.schedule("good", id="good")
    q.schedule("later", id="later")
    redis_client.hset(q.keys.messages, "later", f"{T0:x},0,v99,a field this release lacks")
    claimed = q.claim(10)
    assert [m.id for m in claimed] == ["good"]
    assert q.counts() == {**EMPTY, "unack": 1, "retry": 1}
    assert redis_client.zcard(q.keys.garbage) == 0
    assert not redis_client.hexists(q.keys.attempts, "later")  # no attempt used


# --- ack ------------------------------------------------------------------------------------------


def test_ack_removes_the_message_entirely(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    q.schedule("y", id="y")
    m, other = q.claim()
    assert q.ack(m) == 1
    assert gone(redis_client, q, "x")
    assert q.counts() == {**EMPTY, "unack": 1}
    assert q.ack(m) == 0  # twice: nothing to do
    assert q.ack() == 0
    assert q.ack(other) == 1


def test_ack_with_a_forged_token_is_ignored(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m,) = q.claim()
    forged = Message(m.id, m.queue, m.payload, m.due_ms, m.scheduled_ms, 1, token="999")
    assert q.ack(forged) == 0
    assert q.counts()["unack"] == 1


# --- nack -----------------------------------------------------------------------------------------


def test_nack_retries_after_the_given_delay(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue(max_attempts=3)
    q.schedule("x", id="x")
    (m,) = q.claim()
    assert q.nack(m, delay=7.5, reason="ValueError: boom") == 1
    assert redis_client.zscore(q.keys.retry, "x") == T0 + 7_500
    assert redis_client.hget(q.keys.reasons, "x") == b"ValueError: boom"
    assert q.counts() == {**EMPTY, "retry": 1}
    assert redis_client.hget(q.keys.messages, "x") is not None


def test_nack_without_delay_uses_backoff_with_jitter(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(backoff_base=10, backoff_max=100)
    q.schedule("x", id="x")
    (m,) = q.claim()
    q.nack(m)
    retry_at = redis_client.zscore(q.keys.retry, "x")
    assert T0 + 5_000 <= retry_at <= T0 + 10_000


def test_nack_on_the_last_attempt_goes_to_garbage(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=2)
    q.schedule("x", id="x")
    (m1,) = q.claim()
    assert q.nack(m1, delay=0, reason="first") == 1
    q.promote()
    (m2,) = q.claim()
    assert m2.attempt == 2
    manual_clock.advance(3)
    assert q.nack(m2, delay=0, reason="ValueError: again") == 2
    assert redis_client.zscore(q.keys.garbage, "x") == T0 + 3_000
    assert redis_client.hget(q.keys.reasons, "x").decode() == (
        "no attempts left (2 of 2): ValueError: again"
    )
    assert q.counts() == {**EMPTY, "garbage": 1}


def test_bury_sends_a_delivery_to_garbage_with_its_reason(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue(max_attempts=5)
    q.schedule("x", id="x")
    (m,) = q.claim()
    assert q.bury(m, "no handler for this queue") is True
    assert redis_client.hget(q.keys.reasons, "x") == b"no handler for this queue"
    assert q.counts() == {**EMPTY, "garbage": 1}
    assert q.bury(m, "again") is False


def test_nack_many_reports_each_message(make_queue: Any) -> None:
    q = make_queue(max_attempts=1)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
    a, b, c = q.claim()
    q.ack(c)
    assert q.nack_many([(a, 1.0, "x"), (b, None, "y"), (c, 1.0, "z")]) == [2, 2, 0]
    assert q.nack_many([]) == []


# --- reap -----------------------------------------------------------------------------------------


def test_reap_after_the_deadline_counts_attempts_and_buries_the_last(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=3, visibility_timeout=10, backoff_base=1, backoff_max=60)
    q.schedule("x", id="x")
    for attempt, backoff_ms in ((1, 1_000), (2, 2_000)):
        (m,) = q.claim()
        assert m.attempt == attempt
        deadline = manual_clock.now_ms() + 10_000
        assert q.reap(now_ms=deadline - 1).retried == 0  # not before its deadline
        manual_clock.set(deadline)
        result = q.reap()
        assert (result.retried, result.buried, result.more) == (1, 0, False)
        assert redis_client.zscore(q.keys.retry, "x") == deadline + backoff_ms
        assert redis_client.hget(q.keys.reasons, "x").decode() == (
            f"visibility timeout passed on attempt {attempt}"
        )
        manual_clock.advance(ms=backoff_ms)
        assert q.promote().moved == 1
    (m,) = q.claim()
    assert m.attempt == 3
    manual_clock.advance(10)
    result = q.reap()
    assert (result.retried, result.buried) == (0, 1)
    assert redis_client.zscore(q.keys.garbage, "x") == manual_clock.now_ms()
    reason = redis_client.hget(q.keys.reasons, "x").decode()
    assert reason.startswith("visibility timeout passed on the last attempt (3 of 3)")
    assert redis_client.hget(q.keys.messages, "x") is not None  # dead, not lost
    assert q.counts() == {**EMPTY, "garbage": 1}


def test_reap_is_bounded_and_reports_the_next_deadline(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=10)
    q.schedule_many([{"payload": i} for i in range(20)])
    q.claim(20)
    manual_clock.advance(5)
    q.schedule("late", id="late")
    q.claim()
    now = T0 + 10_000
    first = q.reap(now_ms=now, limit=10)
    assert (first.retried, first.more, first.next_deadline_ms) == (10, True, now)
    second = q.reap(now_ms=now, limit=10)
    # Exactly `limit` reaped and none left past due: no need to call again.
    assert (second.retried, second.more, second.next_deadline_ms) == (10, False, T0 + 15_000)
    third = q.reap(now_ms=T0 + 20_000)
    assert (third.retried, third.more, third.next_deadline_ms) == (1, False, None)


# --- extend and release ---------------------------------------------------------------------------


def test_extend_pushes_the_deadline_of_current_deliveries_only(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=10)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(2)])
    a, b = q.claim()
    manual_clock.advance(8)
    assert q.extend(a) == 1
    assert redis_client.zscore(q.keys.unack, "m0") == T0 + 18_000
    assert q.extend(a, b, seconds=60) == 2
    assert redis_client.zscore(q.keys.unack, "m1") == T0 + 68_000
    manual_clock.advance(100)
    q.reap()
    assert q.extend(a) == 0  # reaped: the deadline is not resurrected
    assert redis_client.zscore(q.keys.unack, "m0") is None
    assert q.extend() == 0


def test_extended_delivery_is_not_reaped(make_queue: Any, manual_clock: Any) -> None:
    q = make_queue(visibility_timeout=10)
    q.schedule("x")
    (m,) = q.claim()
    for _ in range(5):
        manual_clock.advance(8)
        q.extend(m)
        assert q.reap().retried == 0
    assert q.ack(m) == 1


def test_release_gives_back_without_using_an_attempt(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(4)])
    a, b, c = q.claim(3)
    assert q.release(b, c) == 2
    # Back at the front, in their original order, ahead of m3.
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"m1", b"m2", b"m3"]
    assert not redis_client.hexists(q.keys.attempts, "m1")
    assert q.release(b) == 0  # already released
    assert q.ack(b) == 0  # its token is void
    again = q.claim(2)
    assert [(m.id, m.attempt) for m in again] == [("m1", 1), ("m2", 1)]
    assert q.release(a) == 1


def test_release_keeps_earlier_attempts(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m1,) = q.claim()
    q.nack(m1, delay=0)
    q.promote()
    (m2,) = q.claim()
    q.release(m2)
    (m3,) = q.claim()
    assert m3.attempt == 2


# --- late ack and nack ----------------------------------------------------------------------------


def _reap_and_redeliver(q: Any, clock: Any, first: Message) -> Message:
    clock.advance(q.settings.visibility_timeout)
    assert q.reap().retried == 1
    clock.advance(q.settings.backoff_max)
    assert q.promote().moved == 1
    (second,) = q.claim()
    assert second.id == first.id and second.token != first.token
    return second


def test_late_ack_after_redelivery_is_ignored(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=10, backoff_base=1, backoff_max=1)
    q.schedule({"v": 1}, id="x")
    (first,) = q.claim()
    second = _reap_and_redeliver(q, manual_clock, first)
    deadline = redis_client.zscore(q.keys.unack, "x")
    assert q.ack(first) == 0
    # The newer delivery is intact: still in flight with its deadline, envelope and attempts.
    assert redis_client.zscore(q.keys.unack, "x") == deadline
    assert redis_client.hget(q.keys.attempts, "x") == b"2"
    assert q.peek("unack").messages[0].payload == {"v": 1}
    assert q.ack(second) == 1
    assert gone(redis_client, q, "x")


def test_late_nack_after_redelivery_is_ignored(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=10, backoff_base=1, backoff_max=1)
    q.schedule("x", id="x")
    (first,) = q.claim()
    second = _reap_and_redeliver(q, manual_clock, first)
    assert q.nack(first, delay=0, reason="stale") == 0
    assert q.bury(first, "stale") is False
    assert q.counts() == {**EMPTY, "unack": 1}
    assert q.ack(second) == 1


def test_late_ack_while_still_in_retry_removes_the_message(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    # ack.lua: a late ack counts while no newer delivery began (the work was done after all).
    q = make_queue(visibility_timeout=10)
    q.schedule("x", id="x")
    (m,) = q.claim()
    manual_clock.advance(10)
    assert q.reap().retried == 1
    assert q.nack(m, delay=0) == 0  # no longer in flight: a late nack changes nothing
    assert q.counts() == {**EMPTY, "retry": 1}
    assert q.ack(m) == 1
    assert gone(redis_client, q, "x")
    manual_clock.advance(3600)
    assert q.promote().moved == 0  # not delivered twice


def test_late_ack_of_a_delivery_reaped_to_garbage_removes_it(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=10, max_attempts=1)
    q.schedule("x", id="x")
    (m,) = q.claim()
    manual_clock.advance(10)
    assert q.reap().buried == 1
    assert q.ack(m) == 1
    assert gone(redis_client, q, "x")


@pytest.mark.parametrize("how", ["run_now", "requeue"])
def test_late_ack_after_the_message_went_back_to_ready_is_ignored(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any, how: str
) -> None:
    q = make_queue(visibility_timeout=10, max_attempts=1 if how == "requeue" else 5)
    q.schedule("x", id="x")
    (m,) = q.claim()
    manual_clock.advance(10)
    q.reap()
    assert getattr(q, how)("x") == 1
    assert q.ack(m) == 0
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"x"]
    assert q.claim()[0].payload == "x"
