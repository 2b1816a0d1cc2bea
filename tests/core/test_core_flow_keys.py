"""Flow keys, the contract: ``schedule(..., key=...)`` validated, carried in the envelope, seen by
the handler as ``message.key``, and kept in the queue's flow_keys hash exactly as long as the
message exists (docs/flow-control.md, "Keys")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.core.envelope import (
    TASK_MARK,
    decode_envelope_parts,
    encode_envelope,
    has_key,
)
from django_delayqueue.core.errors import PayloadError
from django_delayqueue.core.sharding import ShardedQueue, key_shard, shard_index


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms")


def flow_keys(q: Queue) -> dict[str, str]:
    raw = q.client.hgetall(q.keys.flow_keys)
    return {k.decode(): v.decode() for k, v in raw.items()}


@pytest.mark.parametrize("key", ["+33612345678", "store,42", "t,x", "k3,abc", "é€😀" * 50])
@pytest.mark.parametrize("task", [False, True])
def test_the_key_travels_in_the_envelope(key: str, task: bool) -> None:
    envelope = encode_envelope('{"a":[1]}', 5000, 4000, task=task, key=key)
    parts = decode_envelope_parts(envelope)
    assert (parts.key, parts.task, parts.payload) == (key, task, {"a": [1]})
    assert (parts.due_ms, parts.scheduled_ms) == (5000, 4000)
    assert decode_envelope_parts(envelope.encode()).key == key
    assert has_key(envelope)


def test_an_envelope_without_a_key_is_what_it_was() -> None:
    envelope = encode_envelope('"x"', 5000, 4000, task=True)
    assert envelope == f"1388,3e8,{TASK_MARK}" + '"x"'
    assert decode_envelope_parts(envelope).key is None
    assert not has_key(envelope)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "non-empty"),
        ("x" * 201, "201 characters, over 200"),
        (42, "must be a string, not int"),
        (b"k", "must be a string, not bytes"),
        ("a\udcff", "lone surrogate"),
    ],
)
def test_a_bad_key_is_refused_at_schedule(q: Queue, key: object, says: str) -> None:
    with pytest.raises(PayloadError, match=says):
        q.schedule("hi", key=key)  # type: ignore[arg-type]
    assert q.client.hlen(q.keys.messages) == 0


def test_a_key_of_200_characters_is_taken(q: Queue) -> None:
    result = q.schedule("hi", key="x" * 200)
    assert flow_keys(q) == {result.id: "x" * 200}


def test_the_handler_sees_the_key_and_the_hash_holds_it_until_the_ack(q: Queue) -> None:
    keyed = q.schedule("a", key="+33612345678")
    plain = q.schedule("b")
    assert flow_keys(q) == {keyed.id: "+33612345678"}
    messages = {m.id: m for m in q.claim(10)}
    assert messages[keyed.id].key == "+33612345678"
    assert messages[plain.id].key is None
    q.ack(*messages.values())
    assert flow_keys(q) == {}


def test_a_queue_without_keyed_messages_never_writes_the_hash(
    q: Queue, redis_client: redis.Redis
) -> None:
    q.settings = q.settings.replace(key_concurrency=1, key_rate_limit="1/s")
    q.schedule("a")
    q.schedule("b", delay=5)
    q.ack(*q.claim(10))
    keyed = (q.keys.flow_keys, q.keys.key_turns, q.keys.key_waiting, q.keys.key_tats)
    assert redis_client.exists(*keyed, q.keys.key_state) == 0
    assert redis_client.keys(q.keys.key_lists + "*") == []


def test_the_key_stays_through_retries_and_the_dead_letters_and_goes_with_a_purge(
    q: Queue, manual_clock: ManualClock
) -> None:
    result = q.schedule("a", id="m", key="k1")
    (m,) = q.claim()
    q.nack(m, delay=0, reason="boom")
    manual_clock.advance(1)
    q.promote()
    (m,) = q.claim()
    assert m.key == "k1" and m.attempt == 2
    q.bury(m, "given up")
    assert flow_keys(q) == {result.id: "k1"}
    assert q.requeue("m") == 1
    (m,) = q.claim()
    assert m.key == "k1"
    q.bury(m, "given up")
    assert q.purge("m") == 1
    assert flow_keys(q) == {}


def test_a_cancel_deletes_the_key(q: Queue) -> None:
    q.schedule("a", id="ready", key="k1")
    q.schedule("a", id="later", delay=60, key="k2")
    assert q.cancel("ready", "later") == 2
    assert flow_keys(q) == {}


def test_a_replace_takes_the_new_messages_key_or_none(q: Queue) -> None:
    q.schedule("a", id="x", delay=60, key="k1")
    q.schedule("b", id="x", delay=60, key="k2", replace=True)
    assert flow_keys(q) == {"x": "k2"}
    q.schedule("c", id="x", replace=True)
    assert flow_keys(q) == {}
    q.schedule("d", id="x", replace=True, key="k3")
    (m,) = q.claim()
    assert (m.payload, m.key) == ("d", "k3")


def test_a_successor_brings_its_key_when_the_running_message_is_acked(q: Queue) -> None:
    q.schedule("first", id="x", key="k1")
    (m,) = q.claim()
    q.schedule("next", id="x", key="k2", replace=True)
    assert flow_keys(q) == {"x": "k1"}  # the running delivery keeps its key
    q.ack(m)
    assert flow_keys(q) == {"x": "k2"}
    (m,) = q.claim()
    assert (m.payload, m.key) == ("next", "k2")


def test_a_successor_without_a_key_leaves_none_when_the_running_message_dies(q: Queue) -> None:
    q.schedule("first", id="x", key="k1")
    (m,) = q.claim()
    q.schedule("next", id="x", replace=True)
    q.bury(m, "given up")
    assert flow_keys(q) == {}
    (m,) = q.claim()
    assert (m.payload, m.key) == ("next", None)


def test_a_uniqueness_window_keeps_the_key(q: Queue) -> None:
    first = q.schedule("a", id="x", key="k1", unique_for=60)
    again = q.schedule("b", id="x", key="k2", unique_for=60)
    assert first.created and not again.created
    assert flow_keys(q) == {"x": "k1"}


def test_the_outbox_send_keeps_the_key(q: Queue) -> None:
    prepared = q.prepare("a", key="k1")
    assert q.send_once(prepared, "token-1") is not None
    assert flow_keys(q) == {prepared.id: "k1"}
    (m,) = q.claim()
    assert m.key == "k1"


def test_a_task_may_have_a_key_but_not_with_a_priority(q: Queue) -> None:
    record = q.keys.task_result("t1")
    prepared = q.prepare("a", id="t1", key="k1", task=True)
    with pytest.raises(PayloadError, match="cannot have a priority"):
        q.send_with_record(prepared, record, "{}", priority=5)
    assert q.client.hlen(q.keys.messages) == 0
    assert q.send_with_record(prepared, record, "{}").created
    assert flow_keys(q) == {"t1": "k1"}


@pytest.fixture
def sharded(redis_client: redis.Redis, manual_clock: ManualClock) -> ShardedQueue:
    settings = QueueSettings()
    return ShardedQueue(
        [
            Queue(redis_client, "sms", shard=i, clock=manual_clock, settings=settings)
            for i in range(4)
        ]
    )


def test_a_sharded_queue_keeps_every_message_of_a_key_on_the_keys_shard(
    sharded: ShardedQueue,
) -> None:
    for key in ("a", "b", "c", "d", "e"):
        home = sharded.shards[key_shard(key, 4)]
        ids = [sharded.schedule(n, key=key).id for n in range(5)]
        assert all(shard_index(i, 4) == key_shard(key, 4) for i in ids)
        assert {k for k, v in flow_keys(home).items() if v == key} == set(ids)
        assert sharded.cancel(ids[0]) == 1  # found by id, as any message


def test_a_sharded_queue_refuses_a_given_id_that_routes_away_from_its_key(
    sharded: ShardedQueue,
) -> None:
    home = key_shard("k1", 4)
    away = next(f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) != home)
    with pytest.raises(PayloadError, match="leave id= out"):
        sharded.schedule("a", id=away, key="k1")
    fits = next(f"id-{n}" for n in range(100) if shard_index(f"id-{n}", 4) == home)
    assert sharded.schedule("a", id=fits, key="k1").created


def test_peek_lists_keyed_ready_messages_after_the_others(q: Queue) -> None:
    q.schedule("p", id="plain")
    for n in range(3):
        q.schedule(n, id=f"a{n}", key="a")
    q.schedule("b", id="b0", key="b")
    page = q.peek("ready", 0, 50)
    assert page.total == 5
    assert [m.id for m in page.messages] == ["plain", "a0", "a1", "a2", "b0"]
    assert [m.id for m in q.peek("ready", 2, 2).messages] == ["a1", "a2"]
    assert [m.id for m in q.peek("ready", 4, 10).messages] == ["b0"]


def test_an_ack_whose_keyed_successor_meets_a_broken_key_load_changes_nothing(
    q: Queue,
) -> None:
    """ack.lua checks the types of the keys it writes before its first write (a script is not
    rolled back): key_load too, which the successor's key_push writes. Else the ack removes
    the running message and then fails placing its successor: the successor is lost."""
    q.schedule("first", id="x")  # no key: the queue has no keyed message yet
    (m,) = q.claim()
    q.schedule("next", id="x", key="k2", replace=True)
    q.client.set(q.keys.key_load, "broken")
    with pytest.raises(Exception, match=r"key_load|WRONGTYPE|type"):
        q.ack(m)
    assert q.client.zscore(q.keys.unack, "x") is not None  # still in flight: nothing changed
    q.client.delete(q.keys.key_load)
    assert q.ack(m) == 1
    (m,) = q.claim()
    assert (m.payload, m.key) == ("next", "k2")


@pytest.mark.parametrize("end", ["bury", "reap"])
def test_a_death_whose_keyed_successor_meets_a_broken_key_load_changes_nothing(
    make_queue: Callable[..., Queue], manual_clock: ManualClock, end: str
) -> None:
    """As for the ack: nack.lua and reap.lua place a dying message's successor (which may
    bring the queue's first key) only after checking every key they write, key_load too."""
    q = make_queue("sms", max_attempts=1, visibility_timeout=30)
    q.schedule("first", id="x")
    (m,) = q.claim()
    q.schedule("next", id="x", key="k2", replace=True)
    q.client.set(q.keys.key_load, "broken")
    with pytest.raises(Exception, match=r"key_load|WRONGTYPE|type"):
        if end == "bury":
            q.bury(m, "given up")
        else:
            manual_clock.advance(31)
            q.reap()
    assert q.client.zscore(q.keys.unack, "x") is not None  # still in flight: nothing changed
