"""A recurring schedule's flow key (``Recurrence.key``): every tick carries it as
``schedule(..., key=)`` would; a schedule without one reads, publishes and signs as before keys
existed; a sharded queue keeps a keyed schedule only where its name and its key share a shard."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from core_consumer_support import T0, keeper_rounds

from django_delayqueue.core import Queue, QueueSettings
from django_delayqueue.core.envelope import decode_envelope_parts
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper
from django_delayqueue.core.sharding import key_shard, keyed_schedule_problem, shard_index


def flow_keys(client: redis.Redis, q: Queue) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(q.keys.flow_keys).items()}


def test_every_tick_carries_the_schedules_key(make_queue: Any, redis_client: redis.Redis) -> None:
    q = make_queue("reports")
    keyed = Recurrence("sync-store-7", "reports", every=60, payload={"store": 7}, key="store-7")
    plain = Recurrence("digest", "reports", every=60)
    keeper = ScheduleKeeper()
    keeper.set_definitions([keyed, plain], [q])
    keeper_rounds(keeper, [q], redis_client, T0)
    tick = keyed.tick_id(keyed.next_after(T0))
    assert flow_keys(redis_client, q) == {tick: "store-7"}
    assert decode_envelope_parts(redis_client.hget(q.keys.messages, tick)).key == "store-7"
    other = plain.tick_id(plain.next_after(T0))
    assert decode_envelope_parts(redis_client.hget(q.keys.messages, other)).key is None


def test_a_key_for_function_gives_ticks_their_key(
    make_queue: Any, redis_client: redis.Redis
) -> None:
    # The Django layer's hook (worker.tick_key): a task schedule's key from its arguments.
    q = make_queue("reports")
    r = Recurrence("nightly", "reports", every=60, kwargs={"store_id": 9}, task="shop.tasks.sync")
    keeper = ScheduleKeeper(key_for=lambda rec: f"store-{rec.kwargs['store_id']}")
    keeper.set_definitions([r], [q])
    keeper_rounds(keeper, [q], redis_client, T0)
    assert list(flow_keys(redis_client, q).values()) == ["store-9"]


def test_a_schedule_without_a_key_maps_and_signs_as_before() -> None:
    plain = Recurrence("digest", "reports", every=60, payload=1)
    assert "key" not in plain.to_mapping()  # readable by a release without keys
    assert Recurrence.from_mapping("digest", plain.to_mapping()) == plain
    keyed = Recurrence("digest", "reports", every=60, payload=1, key="k")
    assert keyed.to_mapping()["key"] == "k"
    assert Recurrence.from_mapping("digest", keyed.to_mapping()) == keyed
    # A key given, changed or taken away is an edit: the waiting tick is replaced.
    assert len({plain.signature(), keyed.signature(), keyed_as("k2").signature()}) == 3


def keyed_as(key: str) -> Recurrence:
    return Recurrence("digest", "reports", every=60, payload=1, key=key)


@pytest.mark.parametrize(("key", "says"), [("", "non-empty"), (42, "must be a string")])
def test_a_bad_key_is_refused_with_the_other_problems(key: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match=f"'key': .*{says}"):
        Recurrence("digest", "reports", every=60, key=key)


def test_on_a_sharded_queue_a_keyed_schedule_ticks_only_where_name_and_key_meet(
    redis_client: redis.Redis, manual_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    shards = [
        Queue(redis_client, "sms", shard=i, clock=manual_clock, settings=QueueSettings())
        for i in range(4)
    ]
    for q in shards:
        q.shard_count = 4
    home = key_shard("store-1", 4)
    fits = next(f"s{n}" for n in range(100) if shard_index(f"s{n}", 4) == home)
    away = next(f"s{n}" for n in range(100) if shard_index(f"s{n}", 4) != home)
    problem = keyed_schedule_problem(away, "store-1", 4)
    assert problem is not None and f"shard {home}" in problem
    hinted = problem.split("(e.g. '")[1].split("'")[0]
    assert keyed_schedule_problem(hinted, "store-1", 4) is None  # the name it suggests fits
    assert keyed_schedule_problem(fits, "store-1", 4) is None
    good = Recurrence(fits, "sms", every=60, key="store-1")
    bad = Recurrence(away, "sms", every=60, key="store-1")
    keeper = ScheduleKeeper()
    keeper.set_definitions([good, bad], shards)
    with caplog.at_level(logging.ERROR, "django_delayqueue.core.recurring.keeper"):
        keeper_rounds(keeper, shards, redis_client, T0)
    assert list(flow_keys(redis_client, shards[home]).values()) == ["store-1"]
    assert sum(redis_client.zcard(q.keys.pending) for q in shards) == 1  # the good one's
    assert any(f"schedule {away}" in r.getMessage() for r in caplog.records)


def test_a_withdrawn_tick_takes_its_key_along(make_queue: Any, redis_client: redis.Redis) -> None:
    q = make_queue("reports")
    keeper = ScheduleKeeper()
    keeper.set_definitions([keyed_as("k1")], [q], version=1)
    keeper_rounds(keeper, [q], redis_client, T0)
    assert list(flow_keys(redis_client, q).values()) == ["k1"]
    keeper.set_definitions([keyed_as("k2")], [q], version=2)  # an edit: the tick is replaced
    keeper_rounds(keeper, [q], redis_client, T0 + 1000)
    assert list(flow_keys(redis_client, q).values()) == ["k2"]
    keeper.set_definitions([], [q], version=3)  # deleted: its waiting tick is withdrawn
    keeper_rounds(keeper, [q], redis_client, T0 + 2000)
    assert flow_keys(redis_client, q) == {} and redis_client.hlen(q.keys.messages) == 0


def test_missed_ticks_created_due_wait_in_their_keys_turns(
    make_queue: Any, redis_client: redis.Redis
) -> None:
    # Ticks created already due (catch_up "all" after an outage) reach their key's list, in
    # due order behind the tick still in pending (includes/key_turns.lua, due_unpromoted), as
    # any keyed message due now: key_concurrency counts them.
    q = make_queue("reports", key_concurrency=1)
    r = Recurrence("beat", "reports", every=1, catch_up="all", key="store-1")
    keeper = ScheduleKeeper()
    keeper.set_definitions([r], [q])
    keeper_rounds(keeper, [q], redis_client, T0)
    keeper_rounds(keeper, [q], redis_client, T0 + 10_000)  # ten ticks missed meanwhile
    q.clock.set(T0 + 10_000)  # type: ignore[attr-defined]
    q.promote()
    assert q.counts()["ready"] >= 9
    (first,) = q.claim(20)  # one of the key at a time
    assert first.key == "store-1" and q.claim(20) == []


@pytest.mark.parametrize("shards", [2, 1024])
def test_the_hint_names_a_schedule_name_on_the_keys_shard(shards: int) -> None:
    name = next(
        f"s{n}" for n in range(5000) if shard_index(f"s{n}", shards) != key_shard("k", shards)
    )
    problem = keyed_schedule_problem(name, "k", shards)
    assert problem is not None
    hinted = problem.split("(e.g. '")[1].split("'")[0]
    assert keyed_schedule_problem(hinted, "k", shards) is None
    too_long = "x" * 100  # a name of the longest kind: a suffix would make it too long
    if shard_index(too_long, shards) != key_shard("k", shards):
        assert "e.g." not in (keyed_schedule_problem(too_long, "k", shards) or "")
