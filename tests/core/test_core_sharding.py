"""Sharded queues (core.sharding): one logical queue over N hash tags, routed by id."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from memory_support import full

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.sharding import ShardedQueue, shard_index


@pytest.fixture
def sharded(redis_client: redis.Redis, manual_clock: ManualClock) -> ShardedQueue:
    settings = QueueSettings()
    return ShardedQueue(
        [
            Queue(redis_client, "orders", shard=i, clock=manual_clock, settings=settings)
            for i in range(3)
        ]
    )


def test_each_shard_has_its_own_hash_tag_and_name() -> None:
    tags = {QueueKeys("dq", "orders", shard=i).tag for i in range(3)}
    assert tags == {"{dq:orders#0}", "{dq:orders#1}", "{dq:orders#2}"}
    assert QueueKeys("dq", "orders").tag == "{dq:orders}"  # unsharded keys are unchanged
    q = Queue(redis.Redis(), "orders", shard=1)
    assert (q.name, q.logical_name) == ("orders#1", "orders")


def test_an_id_always_maps_to_the_same_shard() -> None:
    # CRC-32, not hash(): the same in every process (PYTHONHASHSEED varies by process).
    assert shard_index("order-42", 3) == 1
    assert [shard_index(f"m{i}", 3) for i in range(6)] == [
        shard_index(f"m{i}", 3) for i in range(6)
    ]
    assert {shard_index(f"m{i}", 3) for i in range(100)} == {0, 1, 2}


def test_schedule_is_idempotent_and_cancel_works_by_id(sharded: ShardedQueue) -> None:
    first = sharded.schedule({"n": 1}, delay=60, id="order-42")
    again = sharded.schedule({"n": 2}, delay=60, id="order-42")
    assert first.created and not again.created and again.state == "pending"
    home = sharded.shard_for("order-42")
    assert home.client.zscore(home.keys.pending, "order-42") == first.due_ms
    assert sharded.counts()["pending"] == 1
    assert sharded.cancel("order-42") == 1
    assert sharded.counts()["pending"] == 0


def test_counts_add_the_shards_up_and_each_shard_claims_its_own(
    sharded: ShardedQueue,
) -> None:
    for i in range(30):
        sharded.schedule({"n": i}, id=f"m{i}")
    assert sharded.counts()["ready"] == 30
    per_shard = [len(q.claim(100)) for q in sharded.shards]
    assert sum(per_shard) == 30 and all(per_shard)  # every shard got some


def test_schedule_many_routes_items_and_reports_refusals_at_their_place(
    sharded: ShardedQueue,
) -> None:
    items = [{"payload": i, "id": f"b{i}"} for i in range(10)]
    items.insert(4, {"payload": object(), "id": "bad"})
    items.append({"payload": "no id"})
    result = sharded.schedule_many(items)
    assert result.scheduled == 11
    assert [(r.index, r.id) for r in result.rejected] == [(4, "bad")]
    assert sharded.counts()["ready"] == 11


def test_what_a_full_redis_refused_is_reported_at_its_place(
    sharded: ShardedQueue, redis_client: redis.Redis
) -> None:
    items = [{"payload": i, "id": f"b{i}"} for i in range(10)]
    items.insert(3, {"payload": object(), "id": "bad"})
    with full(redis_client):
        result = sharded.schedule_many(items)
        prepared = sharded.schedule_prepared([sharded.prepare(i, id=f"p{i}") for i in range(5)])
    assert [r.index for r in result.not_scheduled] == [i for i in range(11) if i != 3]
    assert [r.id for r in result.not_scheduled] == [f"b{i}" for i in range(10)]
    assert [(r.index, r.id) for r in prepared.not_scheduled] == [(i, f"p{i}") for i in range(5)]
    assert sharded.counts()["ready"] == 0


def test_peek_pages_through_every_shard(sharded: ShardedQueue) -> None:
    for i in range(12):
        sharded.schedule({"n": i}, delay=60 + i, id=f"p{i}")
    first, second = sharded.peek("pending", 0, 7), sharded.peek("pending", 7, 7)
    assert first.total == second.total == 12
    ids = [m.id for m in first.messages + second.messages]
    assert len(first.messages) == 7 and sorted(ids) == sorted(f"p{i}" for i in range(12))


def test_requeue_and_purge_without_ids_act_on_every_shard(
    sharded: ShardedQueue, make_queue: Callable[..., Queue]
) -> None:
    for i in range(9):
        sharded.schedule({"n": i}, id=f"d{i}")
    for q in sharded.shards:
        for m in q.claim(100):
            q.bury(m, "poison")
    assert sharded.counts()["garbage"] == 9
    assert sharded.requeue() == 9
    assert sharded.counts()["ready"] == 9
    for q in sharded.shards:
        for m in q.claim(100):
            q.bury(m, "poison")
    assert sharded.purge() == 9
    assert sharded.counts() == {s: 0 for s in ("pending", "ready", "unack", "retry", "garbage")}


def test_peek_takes_queue_peek_s_bounds_and_reads_a_shard_past_its_first_page(
    sharded: ShardedQueue,
) -> None:
    from django_delayqueue.core.errors import ConfigurationError

    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}):
        with pytest.raises(ConfigurationError):
            sharded.peek("pending", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        sharded.peek("nowhere")
    sharded.schedule_many([{"payload": i, "id": f"x{i}", "delay": 60} for i in range(2500)])
    page = sharded.peek("pending", 0, 1000)
    expected: list[str] = []
    for q in sharded.shards:  # shard after shard, each in its own order
        expected += [m.id for m in q.peek("pending", 0, 1000).messages]
    assert [m.id for m in page.messages] == expected[:1000] and page.total == 2500


def test_a_schedule_s_ticks_live_on_its_shard_and_are_found_there_by_id(
    sharded: ShardedQueue, manual_clock: ManualClock
) -> None:
    from core_consumer_support import keeper_rounds

    from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper

    beat = Recurrence("beat", "orders", every=60)
    ticks = [beat.tick_id(manual_clock.now_ms() + n * 60_000) for n in range(20)]
    # Tick ids hash all over the shards by themselves; routed by the schedule's name, never.
    assert {shard_index(t, 3) for t in ticks} == {shard_index("beat", 3)}
    keeper = ScheduleKeeper()
    keeper.set_definitions([beat], sharded.shards)
    keeper_rounds(keeper, sharded.shards, sharded.client, manual_clock.now_ms())
    first = beat.tick_id(beat.next_after(manual_clock.now_ms()))
    assert sharded.shard_for(first).counts()["pending"] == 1
    assert sharded.cancel(first) == 1  # cancel by id finds it
