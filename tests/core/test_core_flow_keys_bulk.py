"""Flow keys in ``schedule_many`` (docs/flow-control.md, "Keys"): an item's ``key`` is carried as
``schedule(..., key=)`` carries it, a bad one is rejected at its place, and a sharded queue
routes a keyed item to its key's shard."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.core.envelope import decode_envelope_parts
from django_delayqueue.core.sharding import ShardedQueue, key_shard, shard_index


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms")


@pytest.fixture
def sharded(redis_client: redis.Redis, manual_clock: ManualClock) -> ShardedQueue:
    settings = QueueSettings()
    return ShardedQueue(
        [
            Queue(redis_client, "sms", shard=i, clock=manual_clock, settings=settings)
            for i in range(4)
        ]
    )


def flow_keys(q: Queue) -> dict[str, str]:
    raw = q.client.hgetall(q.keys.flow_keys)
    return {k.decode(): v.decode() for k, v in raw.items()}


def stored_key(q: Queue, message_id: str) -> str | None:
    return decode_envelope_parts(q.client.hget(q.keys.messages, message_id)).key


def test_each_item_keeps_its_key_in_every_kind_of_run(q: Queue) -> None:
    # Plain, replacing and windowed runs go through three scripts: each keeps the key.
    result = q.schedule_many(
        [
            {"payload": 1, "id": "a", "key": "store-1"},
            {"payload": 2, "id": "b"},
            {"payload": 3, "id": "c", "key": "store-2", "replace": True},
            {"payload": 4, "id": "d", "key": "store-1", "unique_for": 60},
            {"payload": 5, "id": "e", "key": "store-3", "delay": 30},
        ]
    )
    assert (result.scheduled, result.rejected) == (5, [])
    assert flow_keys(q) == {"a": "store-1", "c": "store-2", "d": "store-1", "e": "store-3"}
    assert [stored_key(q, i) for i in "abcde"] == ["store-1", None, "store-2", "store-1", "store-3"]
    due = {m.id: m.key for m in q.claim(10)}
    assert due == {"a": "store-1", "b": None, "c": "store-2", "d": "store-1"}


def test_a_replacing_item_brings_its_key_or_none(q: Queue) -> None:
    q.schedule("old", id="x", key="store-1", delay=60)
    q.schedule("old", id="y", key="store-1", delay=60)
    result = q.schedule_many(
        [{"payload": 1, "id": "x", "key": "store-2"}, {"payload": 2, "id": "y"}], replace=True
    )
    assert result.replaced == 2
    assert flow_keys(q) == {"x": "store-2"}


@pytest.mark.parametrize(
    ("key", "says"), [("", "non-empty"), (7, "must be a string"), ("x" * 201, "over 200")]
)
def test_a_bad_key_rejects_its_item_alone(q: Queue, key: object, says: str) -> None:
    result = q.schedule_many(
        [{"payload": 1, "id": "a", "key": "ok"}, {"payload": 2, "id": "b", "key": key}]
    )
    assert result.scheduled == 1
    (rejected,) = result.rejected
    assert (rejected.index, rejected.id) == (1, "b") and says in rejected.reason
    assert flow_keys(q) == {"a": "ok"}


def test_a_sharded_queue_sends_keyed_items_to_their_keys_shard(sharded: ShardedQueue) -> None:
    keys = [f"store-{n}" for n in range(12)]
    result = sharded.schedule_many([{"payload": n, "key": key} for n, key in enumerate(keys)])
    assert (result.scheduled, result.rejected) == (12, [])
    for key in keys:
        home = sharded.shards[key_shard(key, 4)]
        (message_id,) = [i for i, k in flow_keys(home).items() if k == key]
        assert shard_index(message_id, 4) == key_shard(key, 4)  # found by id too
        assert sharded.cancel(message_id) == 1


def test_a_sharded_queue_rejects_a_keyed_item_whose_id_routes_elsewhere(
    sharded: ShardedQueue,
) -> None:
    home = key_shard("k1", 4)
    away = next(f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) != home)
    fits = next(f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) == home)
    result = sharded.schedule_many(
        [
            {"payload": 1, "id": away, "key": "k1"},
            {"payload": 2, "id": fits, "key": "k1"},
            {"payload": 3, "key": ""},
            {"payload": 4, "key": "k1", "unique_for": 5},
        ]
    )
    assert result.scheduled == 1
    reasons = {r.index: (r.id, r.reason) for r in result.rejected}
    assert reasons[0][0] == away and "leave id= out" in reasons[0][1]
    assert reasons[2][0] is None and "non-empty" in reasons[2][1]
    assert "unique_for" in reasons[3][1]  # no id made up that would make the window a no-op
    assert flow_keys(sharded.shards[home]) == {fits: "k1"}
