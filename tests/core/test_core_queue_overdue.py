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


# --- issue 37: a keyed backlog is overdue like any other -----------------------------------------


def test_a_keyed_backlog_no_limit_holds_is_overdue(make_queue: Any, manual_clock: Any) -> None:
    """No key limit at all, and no consumer claims (one slow thread): 39 keyed messages due
    10 s ago wait only for a consumer, as their unkeyed twins do. The stats and the health
    probe read the same figure (Queue.snapshot, counts.lua)."""
    keyed, plain = make_queue("keyed"), make_queue("plain")
    for n in range(39):
        keyed.schedule({"n": n}, key=f"store-{n % 3}")
        plain.schedule({"n": n})
    manual_clock.advance(10)
    assert plain.snapshot().oldest_overdue_ms == 10_000
    assert keyed.snapshot().oldest_overdue_ms == 10_000


def test_keyed_messages_their_keys_limits_hold_are_not_overdue(
    make_queue: Any, manual_clock: Any
) -> None:
    """key_concurrency 1: a key whose one message runs holds its next ones back on purpose;
    once a slot frees and no consumer claims, they are overdue from the slot's end, and a key
    waiting for its token is overdue only once the token came."""
    q = make_queue("sms", key_concurrency=1, key_rate_limit="1/m")
    for n in range(3):
        q.schedule({"n": n}, key="a")
    (running,) = q.claim(5)  # key a: its slot taken, its token 60 s on
    manual_clock.advance(10)
    assert q.snapshot().oldest_overdue_ms is None
    q.ack(running)  # T0 + 10 s: the slot is free, the token still 50 s away
    manual_clock.advance(20)
    assert q.snapshot().oldest_overdue_ms is None
    manual_clock.advance(40)  # T0 + 70 s: the token came at T0 + 60 s, nobody claimed
    assert q.snapshot().oldest_overdue_ms == 10_000


def test_the_stats_and_health_report_a_keyed_backlog_overdue(
    make_queue: Any, manual_clock: Any
) -> None:
    """monitoring.stats (admin, queuestats, metrics, the health probe's overdue check) read
    counts.lua's figure: the keyed queue reports its 10 s too."""
    from django_delayqueue.monitoring.stats import gather

    q = make_queue("keyed")
    for n in range(39):
        q.schedule({"n": n}, key=f"store-{n % 3}")
    manual_clock.advance(10)
    (got,) = gather([q])
    assert got.oldest_overdue_ms == 10_000
