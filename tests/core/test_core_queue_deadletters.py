"""Cancel, run_now, requeue, purge, counts, snapshots and peek against the real server."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayqueue.core import STATES, ConfigurationError, snapshots
from django_delayqueue.core.envelope import decode_envelope

T0 = 1_700_000_000_000
EMPTY = dict.fromkeys(STATES, 0)


def put_in_every_state(q: Any) -> None:
    """One message per state, each id named after its state."""
    for state in ("ready", "unack", "retry", "garbage"):
        q.schedule({"state": state}, id=state)
    claimed = {m.id: m for m in q.claim(10)}
    q.release(claimed["ready"])
    q.nack(claimed["retry"], delay=60, reason="ValueError: later")
    q.bury(claimed["garbage"], "no handler")
    q.schedule({"state": "pending"}, delay=30, id="pending")
    assert q.counts() == dict.fromkeys(STATES, 1)


# --- cancel ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "ready", "retry"])
def test_cancel_removes_a_waiting_message(
    redis_client: redis.Redis, make_queue: Any, state: str
) -> None:
    q = make_queue()
    put_in_every_state(q)
    assert q.cancel(state) == 1
    assert q.counts() == {**dict.fromkeys(STATES, 1), state: 0}
    k = q.keys
    for h in (k.messages, k.attempts, k.tokens, k.reasons):
        assert not redis_client.hexists(h, state)
    assert q.cancel(state) == 0


@pytest.mark.parametrize("state", ["unack", "garbage"])
def test_cancel_leaves_running_and_dead_messages_alone(
    redis_client: redis.Redis, make_queue: Any, state: str
) -> None:
    q = make_queue()
    put_in_every_state(q)
    assert q.cancel(state) == 0
    assert q.counts() == dict.fromkeys(STATES, 1)
    assert redis_client.hexists(q.keys.messages, state)


def test_cancel_of_unknown_ids_and_of_many(make_queue: Any) -> None:
    q = make_queue()
    assert q.cancel("nope") == 0
    assert q.cancel() == 0
    put_in_every_state(q)
    assert q.cancel(*STATES, "nope") == 3
    assert q.counts() == {**EMPTY, "unack": 1, "garbage": 1}


def test_cancelled_id_can_be_scheduled_again(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("old", delay=5, id="x")
    q.cancel("x")
    assert q.schedule("new", id="x").created
    assert q.claim()[0].payload == "new"


# --- run_now --------------------------------------------------------------------------------------


def test_run_now_moves_pending_and_retry_to_ready(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    put_in_every_state(q)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(q.keys.wake_channel)
    pubsub.get_message(timeout=5)
    assert q.run_now("pending", "retry", "unack", "garbage", "ready", "nope") == 2
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"ready", b"pending", b"retry"]
    assert not redis_client.hexists(q.keys.tokens, "retry")
    assert pubsub.get_message(timeout=5) is not None  # consumers wake for it
    pubsub.close()
    assert q.run_now() == 0
    assert q.counts() == {**EMPTY, "ready": 3, "unack": 1, "garbage": 1}


# --- requeue and purge ----------------------------------------------------------------------------


def test_requeue_brings_dead_letters_back_with_fresh_attempts(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    put_in_every_state(q)
    assert q.requeue("garbage", "pending", "nope") == 1
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"ready", b"garbage"]
    for h in (q.keys.attempts, q.keys.tokens, q.keys.reasons):
        assert not redis_client.hexists(h, "garbage")
    assert q.counts() == {**dict.fromkeys(STATES, 1), "ready": 2, "garbage": 0}
    claimed = {m.id: m for m in q.claim(10)}
    assert claimed["garbage"].attempt == 1
    assert claimed["garbage"].payload == {"state": "garbage"}


def test_requeue_all_drains_in_bounded_calls(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i:02}"} for i in range(25)])
    for m in q.claim(25):
        q.bury(m, "dead")
    assert q.requeue(limit=10) == 25
    assert q.counts() == {**EMPTY, "ready": 25}
    assert q.requeue() == 0


def test_purge_deletes_dead_letters_only(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    put_in_every_state(q)
    assert q.purge("pending", "ready", "unack", "retry") == 0  # not dead: untouched
    assert q.counts() == dict.fromkeys(STATES, 1)
    assert q.purge("garbage") == 1
    assert q.counts() == {**dict.fromkeys(STATES, 1), "garbage": 0}
    for h in (q.keys.messages, q.keys.attempts, q.keys.tokens, q.keys.reasons):
        assert not redis_client.hexists(h, "garbage")
    assert redis_client.hexists(q.keys.messages, "pending")


def test_purge_all_drains_in_bounded_calls(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i} for i in range(25)])
    q.schedule("keep", delay=5, id="keep")
    for m in q.claim(25):
        q.bury(m, "dead")
    assert q.purge(limit=10) == 25
    assert q.counts() == {**EMPTY, "pending": 1}
    assert redis_client.hlen(q.keys.messages) == 1
    assert q.purge() == 0


# --- the result records of tasks (a hash beside the message, QueueKeys.task_result) ---------


def dead_tasks(q: Any, redis_client: redis.Redis, *ids: str) -> None:
    """Dead letters whose result records say FAILED with the expiry a finished task has."""
    for message_id in ids:
        prepared = q.prepare({"task": message_id}, id=message_id)
        q.send_with_record(prepared, q.keys.task_result(message_id), "{}")
    for m in q.claim(len(ids)):
        q.bury(m, "used its last attempt")
        redis_client.hset(q.keys.task_result(m.id), "status", "FAILED")
        redis_client.expire(q.keys.task_result(m.id), 3600)  # a backend's RESULT_TTL


@pytest.mark.parametrize("by_id", [True, False], ids=["by id", "all"])
def test_a_requeued_task_record_loses_its_expiry(
    redis_client: redis.Redis, make_queue: Any, by_id: bool
) -> None:
    """It may wait and run for longer than its FAILED end's expiry: its record must be there
    when it ends (and requeueing a plain message creates no record)."""
    q = make_queue()
    dead_tasks(q, redis_client, "t1", "t2")
    q.schedule({"plain": 1}, id="plain")
    q.bury(q.claim(1)[0], "no handler")
    assert (q.requeue("t1", "t2", "plain") if by_id else q.requeue(limit=2)) == 3
    for message_id in ("t1", "t2"):
        assert redis_client.ttl(q.keys.task_result(message_id)) == -1
    assert not redis_client.exists(q.keys.task_result("plain"))


def test_a_purged_task_record_keeps_the_expiry_it_has(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A FAILED end gave it the backend's RESULT_TTL (here shorter than the 7-day default);
    one buried with no such write (a reap, a claim) gets the default."""
    from django_delayqueue.core.housekeeping import ENDED_RECORD_TTL_SECONDS

    q = make_queue()
    dead_tasks(q, redis_client, "ended", "reaped")
    redis_client.persist(q.keys.task_result("reaped"))
    assert q.purge("ended", "reaped") == 2
    assert 0 < redis_client.ttl(q.keys.task_result("ended")) <= 3600
    assert 3600 < redis_client.ttl(q.keys.task_result("reaped")) <= ENDED_RECORD_TTL_SECONDS


def test_a_cancelled_task_record_keeps_the_expiry_it_has(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    from django_delayqueue.core.housekeeping import ENDED_RECORD_TTL_SECONDS

    q = make_queue()
    for message_id in ("kept", "waiting"):
        prepared = q.prepare({"task": message_id}, delay=60, id=message_id)
        q.send_with_record(prepared, q.keys.task_result(message_id), "{}")
    redis_client.expire(q.keys.task_result("kept"), 3600)
    assert q.cancel("kept", "waiting") == 2
    assert 0 < redis_client.ttl(q.keys.task_result("kept")) <= 3600
    assert 3600 < redis_client.ttl(q.keys.task_result("waiting")) <= ENDED_RECORD_TTL_SECONDS


# --- counts, snapshot, snapshots ------------------------------------------------------------------


def test_counts_and_snapshot_of_an_empty_queue(make_queue: Any) -> None:
    q = make_queue()
    assert q.counts() == EMPTY
    snap = q.snapshot()
    assert (snap.queue, snap.counts, snap.oldest_overdue_ms, snap.next_due_ms) == (
        "q",
        EMPTY,
        None,
        None,
    )


def test_snapshot_tells_how_overdue_the_queue_is(make_queue: Any, manual_clock: Any) -> None:
    q = make_queue()
    q.schedule("a", delay=10, id="a")
    q.schedule("b", delay=20, id="b")
    snap = q.snapshot()
    assert (snap.oldest_overdue_ms, snap.next_due_ms) == (None, T0 + 10_000)
    manual_clock.advance(15)
    assert q.snapshot().oldest_overdue_ms == 5_000  # 'a' is due and not promoted yet
    q.promote()
    snap = q.snapshot()
    assert snap.oldest_overdue_ms == 5_000  # still waiting in ready since its due time
    assert snap.next_due_ms == T0 + 20_000
    assert snap.counts == {**EMPTY, "pending": 1, "ready": 1}
    assert q.snapshot(now_ms=T0 + 25_000).oldest_overdue_ms == 15_000


def test_snapshot_counts_retry_due_times(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x")
    (m,) = q.claim()
    q.nack(m, delay=3)
    snap = q.snapshot()
    assert snap.next_due_ms == T0 + 3_000 and snap.oldest_overdue_ms is None
    assert q.snapshot(now_ms=T0 + 4_000).oldest_overdue_ms == 1_000


def test_snapshots_of_many_queues_in_one_call(make_queue: Any) -> None:
    a, b, c = make_queue("a"), make_queue("b"), make_queue("c")
    put_in_every_state(a)
    b.schedule("x", delay=1)
    result = snapshots([a, b, c])
    assert [s.queue for s in result] == ["a", "b", "c"]
    assert result[0].counts == dict.fromkeys(STATES, 1)
    assert result[1].counts == {**EMPTY, "pending": 1}
    assert result[1].next_due_ms == T0 + 1_000
    assert result[2].counts == EMPTY
    assert snapshots([]) == []


def test_counts_survive_a_corrupt_ready_head(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    redis_client.hset(q.keys.messages, "x", b"not json")
    snap = q.snapshot()
    assert snap.counts == {**EMPTY, "ready": 1}
    assert snap.oldest_overdue_ms is None


# --- peek -----------------------------------------------------------------------------------------


def test_peek_every_state(make_queue: Any) -> None:
    q = make_queue(visibility_timeout=45)
    put_in_every_state(q)
    expected = {
        "pending": (T0 + 30_000, 0, ""),
        "ready": (None, 0, ""),
        "unack": (T0 + 45_000, 1, ""),
        "retry": (T0 + 60_000, 1, "ValueError: later"),
        "garbage": (T0, 1, "no handler"),
    }
    for state, (score, attempts, reason) in expected.items():
        page = q.peek(state)
        assert page.total == 1
        (row,) = page.messages
        assert (row.id, row.state, row.score_ms) == (state, state, score)
        assert (row.attempts, row.reason) == (attempts, reason)
        assert row.payload == {"state": state}
        assert decode_envelope(row.envelope)[2] == {"state": state}


def test_peek_pages_in_order(make_queue: Any) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"p{i}", "delay": 10 - i} for i in range(7)])
    q.schedule_many([{"payload": i, "id": f"r{i}"} for i in range(7)])
    first, second = q.peek("pending", 0, 5), q.peek("pending", 5, 5)
    assert (first.total, second.total) == (7, 7)
    assert [m.id for m in first.messages + second.messages] == [f"p{i}" for i in range(6, -1, -1)]
    assert [m.id for m in q.peek("ready", 2, 3).messages] == ["r2", "r3", "r4"]
    assert q.peek("ready", 100).messages == []


def test_peek_shows_a_corrupt_or_missing_envelope(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    q.schedule("y", id="y")
    redis_client.hset(q.keys.messages, "x", b"{broken")
    redis_client.hdel(q.keys.messages, "y")
    rows = q.peek("ready").messages
    assert [(r.envelope, r.payload, r.due_ms) for r in rows] == [
        ("{broken", None, None),
        ("", None, None),
    ]


@pytest.mark.parametrize(
    "args,problem",
    [(("dead",), "unknown state"), (("ready", -1), "offset"), (("ready", 0, 0), "limit")],
)
def test_peek_refuses_bad_arguments(make_queue: Any, args: tuple, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        make_queue().peek(*args)
