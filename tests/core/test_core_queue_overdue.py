"""How overdue a queue is: a message back in ready counts from when it came back, not its due.

A requeued, retried, run-now or released message keeps its envelope's original due time; the
oldest-overdue figure (stats, metrics, health probe) must not jump by its whole history when
such a message reaches the head of the ready list.
"""

from __future__ import annotations

from typing import Any

import redis

T0 = 1_700_000_000_000


def test_a_requeued_message_is_overdue_from_its_requeue(make_queue: Any, manual_clock: Any) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m,) = q.claim()
    q.bury(m, "dead")
    manual_clock.advance(3600)
    assert q.requeue("x") == 1
    assert q.snapshot().oldest_overdue_ms == 0
    manual_clock.advance(2)
    assert q.snapshot().oldest_overdue_ms == 2_000


def test_a_retried_message_is_overdue_from_its_retry_time(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m,) = q.claim()
    q.nack(m, delay=60)
    manual_clock.advance(65)
    assert q.promote().moved == 1
    assert q.snapshot().oldest_overdue_ms == 5_000  # since T0 + 60 s, not since T0


def test_a_message_run_now_is_overdue_from_then(make_queue: Any, manual_clock: Any) -> None:
    q = make_queue()
    q.schedule("x", delay=3600, id="x")
    assert q.run_now("x") == 1
    manual_clock.advance(1)
    # Its envelope says due in an hour: without the time it entered ready it was not overdue.
    assert q.snapshot().oldest_overdue_ms == 1_000


def test_a_released_redelivery_is_overdue_from_its_release(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m,) = q.claim()
    q.nack(m, delay=10)
    manual_clock.advance(10)
    q.promote()
    (again,) = q.claim()
    manual_clock.advance(5)
    assert q.release(again) == 1
    assert q.snapshot().oldest_overdue_ms == 0


def test_a_released_first_delivery_is_overdue_from_its_due_time(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    (m,) = q.claim()
    manual_clock.advance(5)
    assert q.release(m) == 1
    assert q.snapshot().oldest_overdue_ms == 5_000  # it has waited since it was due


def test_the_time_is_forgotten_when_the_message_leaves_ready(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", delay=3600, id="x")
    q.schedule("y", delay=3600, id="y")
    assert q.run_now("x", "y") == 2
    assert redis_client.hlen(q.keys.ready_since) == 2
    (x,) = q.claim(1)
    assert q.cancel("y") == 1
    assert not redis_client.exists(q.keys.ready_since)
    q.ack(x)
    manual_clock.advance(10)
    q.schedule("again", at=T0 + 4_000, id="x")  # the same id, a new message: its own due time
    assert q.snapshot().oldest_overdue_ms == 6_000
