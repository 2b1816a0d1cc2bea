"""django_delayqueue.core.keys: one place spells every key, all under one cluster hash tag."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

from django_delayqueue.core import (
    ConfigurationError,
    ManualClock,
    Queue,
    QueueKeys,
    QueueSettings,
    snapshots,
)
from django_delayqueue.embedded import RedisServerProcess, free_port


def _key_properties() -> list[str]:
    """Every property of QueueKeys that names a Redis key (not the tag or the channel)."""
    return [
        name
        for name, value in vars(QueueKeys).items()
        if isinstance(value, property) and name not in ("tag", "wake_channel")
    ]


def test_keys_are_spelled_under_the_hash_tag() -> None:
    k = QueueKeys("dq", "order-close")
    assert k.tag == "{dq:order-close}"
    assert k.pending == "{dq:order-close}:pending"
    assert k.ready == "{dq:order-close}:ready"
    assert k.unack == "{dq:order-close}:unack"
    assert k.retry == "{dq:order-close}:retry"
    assert k.garbage == "{dq:order-close}:garbage"
    assert k.messages == "{dq:order-close}:messages"
    assert k.wake_channel == "{dq:order-close}:wake"


def test_all_keys_lists_every_key_once() -> None:
    k = QueueKeys("dq", "q")
    expected = {getattr(k, name) for name in _key_properties()}
    assert len(expected) == len(_key_properties()), "two properties spell the same key"
    assert set(k.all_keys()) == expected
    assert len(k.all_keys()) == len(expected)


@pytest.mark.parametrize("prefix,queue", [("dq", "q"), ("shop", "order-close"), ("a.b", "x:y_z")])
def test_every_key_of_a_queue_hashes_to_one_cluster_slot(prefix: str, queue: str) -> None:
    k = QueueKeys(prefix, queue)
    slots = {key_slot(key.encode()) for key in [*k.all_keys(), k.wake_channel]}
    assert slots == {key_slot(k.tag.encode())}


def test_prefix_separates_queues_of_the_same_name() -> None:
    a, b = QueueKeys("one", "q"), QueueKeys("two", "q")
    assert not set(a.all_keys()) & set(b.all_keys())


@pytest.mark.parametrize(
    "name", ["", "has space", "{brace", "brace}", "-starts-with-dash", "x" * 101, "tab\t", "é"]
)
def test_invalid_queue_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid queue name"):
        QueueKeys("dq", name)


def test_invalid_prefix_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="invalid key prefix"):
        QueueKeys("d{q}", "q")


def test_queue_uses_its_prefix(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q", prefix="shop", clock=ManualClock())
    q.schedule({"a": 1}, delay=10)
    keys = {key.decode() for key in redis_client.keys("*")}
    assert keys == {"{shop:q}:pending", "{shop:q}:messages"}


# --- a single-node Redis Cluster: every script's KEYS must share a slot ------------------------ --


@pytest.fixture(scope="module")
def cluster_client() -> Iterator[redis.Redis]:
    """A one-node cluster owning every slot: Redis refuses cross-slot KEYS, as a cluster does."""
    # An explicit bus port: the default (port + 10000) overflows for high free ports.
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    server = RedisServerProcess(args=[*args, "--cluster-port", str(free_port())]).start()
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    try:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while client.cluster("info")["cluster_state"] != "ok":
            assert time.monotonic() < deadline, "single-node cluster did not become ok"
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        server.stop()


def test_cross_slot_keys_are_refused_by_the_cluster_node(cluster_client: redis.Redis) -> None:
    # The check below is only meaningful if the node really enforces one slot per script.
    with pytest.raises(redis.ResponseError, match="same slot"):
        cluster_client.eval("return 1", 2, "{a}:x", "{b}:y")


def test_every_transition_runs_on_a_cluster_node(cluster_client: redis.Redis) -> None:
    clock = ManualClock()
    settings = QueueSettings(max_attempts=2, visibility_timeout=1)
    q = Queue(cluster_client, "clustered", settings=settings, clock=clock)
    other = Queue(cluster_client, "other", settings=settings, clock=clock)
    # Any script touching keys of two slots would raise here (CROSSSLOT), failing the test.
    q.schedule({"n": 1}, id="a")
    q.schedule_many([{"payload": i, "id": f"b{i}"} for i in range(3)])
    q.schedule({"n": 2}, delay=5, id="later")
    assert q.run_now("later") == 1
    q.promote()
    claimed = q.claim(10)
    assert [m.id for m in claimed] == ["a", "b0", "b1", "b2", "later"]
    assert q.extend(claimed[0]) == 1
    assert q.ack(claimed[0]) == 1
    assert q.nack(claimed[1], delay=0, reason="x") == 1
    assert q.release(claimed[2]) == 1
    assert q.bury(claimed[3], "dead")
    clock.advance(2)
    assert q.reap().retried == 1  # "later"
    assert q.requeue() == 1  # b2
    assert q.cancel("b0") == 1
    assert q.bury(q.claim(1)[0], "dead again")  # b1
    assert q.purge() == 1
    assert [m.id for m in q.peek("ready").messages] == ["b2"]
    assert q.snapshot().counts == {"pending": 0, "ready": 1, "unack": 0, "retry": 1, "garbage": 0}
    other.schedule({"n": 3})
    both = snapshots([q, other])
    assert [s.queue for s in both] == ["clustered", "other"]
    assert both[1].counts["ready"] == 1
    slots = {key_slot(key) for key in cluster_client.keys("*")}
    assert len(slots) == 2  # one slot per queue, whatever the scripts touched
