"""Priorities among ready messages: higher first, oldest first within one, and nothing lost.

A message sent with a priority other than 0 (a task's, through ``Queue.send_with_record``)
waits in ready in the ranked zset; a claim takes those above 0, then the plain ready list,
then those below 0. The state machine in test_property_states.py checks every transition
against a model; these tests name the behaviours a user relies on.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayqueue.core import ManualClock, PayloadError, Queue


def send_task(q: Queue, message_id: str, priority: int, delay: float | None = None) -> None:
    prepared = q.prepare({"task": message_id}, delay=delay, id=message_id)
    assert q.send_with_record(
        prepared, q.keys.task_result(message_id), "{}", priority=priority
    ).created


def claim_ids(q: Queue, count: int) -> list[str]:
    return [m.id for m in q.claim(count)]


def test_a_backlog_due_at_once_is_claimed_highest_priority_first(make_queue: Any) -> None:
    q = make_queue()
    for message_id, priority in [("a", 0), ("b", -5), ("c", 10), ("d", 3), ("e", 10), ("f", 0)]:
        send_task(q, message_id, priority)
    q.schedule({"plain": 1}, id="plain")  # dq.schedule: priority 0, behind a and f
    assert q.counts()["ready"] == 7
    assert [m.id for m in q.peek("ready").messages] == ["c", "e", "d", "a", "f", "plain", "b"]
    # In small claims, so that every claim crosses a boundary between priorities.
    assert claim_ids(q, 2) == ["c", "e"]
    assert claim_ids(q, 2) == ["d", "a"]
    assert claim_ids(q, 4) == ["f", "plain", "b"]
    assert q.counts()["ready"] == 0
    assert not q.client.exists(q.keys.ranked)


def test_waiting_tasks_take_their_priority_when_they_become_due(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    q = make_queue()
    send_task(q, "low-first", -1, delay=1)
    manual_clock.advance(ms=10)
    send_task(q, "high-later", 7, delay=1)
    q.schedule({"plain": 1}, delay=1, id="plain")
    manual_clock.advance(2)
    assert q.promote().moved == 3
    assert claim_ids(q, 10) == ["high-later", "plain", "low-first"]


def test_a_retried_task_keeps_its_priority_and_an_acked_one_drops_it(
    make_queue: Any, manual_clock: ManualClock, redis_client: redis.Redis
) -> None:
    q = make_queue()
    send_task(q, "urgent", 50)
    (delivery,) = q.claim(1)
    q.nack(delivery, delay=1, reason="flaky")
    q.schedule({"plain": 1}, id="plain")
    manual_clock.advance(2)
    q.promote()
    (again,) = q.claim(1)
    assert again.id == "urgent" and again.attempt == 2  # ahead of the older plain message
    assert redis_client.hget(q.keys.priorities, "urgent") == b"50"
    q.ack(again)
    assert not redis_client.hexists(q.keys.priorities, "urgent")


def test_cancel_requeue_release_and_run_now_respect_priorities(
    make_queue: Any, manual_clock: ManualClock, redis_client: redis.Redis
) -> None:
    q = make_queue()
    send_task(q, "gone", 5)
    assert q.cancel("gone") == 1
    assert not redis_client.exists(q.keys.ranked)
    assert not redis_client.hexists(q.keys.priorities, "gone")

    send_task(q, "dead", 5)
    q.bury(q.claim(1)[0], "poison")
    q.schedule({"plain": 1}, id="plain")
    assert q.requeue("dead") == 1
    (first,) = q.claim(1)
    assert first.id == "dead"  # back in ready at its priority, ahead of "plain"
    assert q.release(first) == 1
    assert claim_ids(q, 1) == ["dead"]  # released: the head of its priority again

    send_task(q, "later", 9, delay=60)
    assert q.run_now("later") == 1
    assert claim_ids(q, 1) == ["later"]
    assert q.purge() == 0
    assert claim_ids(q, 5) == ["plain"]


def test_a_low_priority_task_waiting_longest_is_the_queue_lag(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    q = make_queue()
    send_task(q, "starved", -10)
    manual_clock.advance(5)
    send_task(q, "urgent", 10)
    q.schedule({"plain": 1}, id="plain")
    manual_clock.advance(1)
    snapshot = q.snapshot()
    assert snapshot.counts["ready"] == 3
    assert snapshot.oldest_overdue_ms == 6000  # the low-priority one, not a band head's


def test_replacing_a_ready_task_drops_its_priority(make_queue: Any) -> None:
    q = make_queue()
    send_task(q, "t", 20)
    q.schedule({"plain": 1}, id="plain")
    q.schedule({"again": 1}, id="t", replace=True)  # a new message: no priority, list tail
    assert claim_ids(q, 2) == ["plain", "t"]
    assert not q.client.hexists(q.keys.priorities, "t")


@pytest.mark.parametrize("bad", [101, -101, 1.5, True, "5"])
def test_a_priority_out_of_range_is_refused_before_anything_is_written(
    make_queue: Any, bad: Any
) -> None:
    q = make_queue()
    prepared = q.prepare({"x": 1}, id="x")
    with pytest.raises(PayloadError, match="priority must be an integer from -100 to 100"):
        q.send_with_record(prepared, q.keys.task_result("x"), "{}", priority=bad)
    assert q.counts()["ready"] == 0
