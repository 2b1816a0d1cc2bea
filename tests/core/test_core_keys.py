"""django_delayqueue.core.keys: one place spells every key, all under one cluster hash tag."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from hypothesis import given, reject
from hypothesis import strategies as st
from redis.crc import key_slot

from django_delayqueue.core import (
    ConfigurationError,
    ManualClock,
    Queue,
    QueueKeys,
    QueueSettings,
    snapshots,
)
from django_delayqueue.core.keys import MAX_SHARDS, published_recurrences_key
from django_delayqueue.embedded import RedisServerProcess, free_port


def _key_properties() -> list[str]:
    """Every property of QueueKeys that names a Redis key (not the tag, the channel or the
    prefix of the per-key lists)."""
    return [
        name
        for name, value in vars(QueueKeys).items()
        if isinstance(value, property) and name not in ("tag", "wake_channel", "key_lists")
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


def test_the_recurring_keys_keep_the_text_deployments_hold() -> None:
    # Renamed in the code (a recurrence is no "schedule", the verb), never in Redis.
    assert QueueKeys("dq", "order-close").recurrence_states == "{dq:order-close}:schedules"
    assert published_recurrences_key("dq") == "{dq}:recurring"


def test_all_keys_lists_every_key_once() -> None:
    k = QueueKeys("dq", "q")
    expected = {getattr(k, name) for name in _key_properties()}
    assert len(expected) == len(_key_properties()), "two properties spell the same key"
    assert set(k.all_keys()) == expected
    assert len(k.all_keys()) == len(expected)


@pytest.mark.parametrize("prefix,queue", [("dq", "q"), ("shop", "order-close"), ("a:b", "x.y_z")])
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


def test_a_queue_name_holding_the_prefix_separator_is_refused_with_the_reason() -> None:
    # "shop" + "eu:orders" would be {shop:eu:orders}, the tag of "shop:eu" + "orders".
    with pytest.raises(ConfigurationError, match="':' separates the key prefix from the queue"):
        QueueKeys("shop", "eu:orders")
    assert QueueKeys("shop:eu", "orders").tag == "{shop:eu:orders}"  # a prefix may hold ':'


def test_sites_whose_prefix_and_queue_split_differently_never_share_a_message(
    redis_client: redis.Redis,
) -> None:
    clock = ManualClock()
    eu_site = Queue(redis_client, "orders", prefix="shop:eu", clock=clock)
    eu_site.schedule({"site": "shop:eu"}, id="order-1")
    with pytest.raises(ConfigurationError, match="a queue name cannot hold it"):
        Queue(redis_client, "eu:orders", prefix="shop", clock=clock)
    # What the other site may name that queue instead has keys of its own.
    other = Queue(redis_client, "eu.orders", prefix="shop", clock=clock)
    assert other.counts()["ready"] == 0 and other.cancel("order-1") == 0
    assert eu_site.counts()["ready"] == 1


# Short names of few characters, ':' among them: collisions need short, similar names.
_ALPHABET = "ab0.:_-"
_names_of = st.text(_ALPHABET, min_size=1, max_size=6).filter(lambda s: s[0].isalnum())
_shards = st.none() | st.integers(0, 3) | st.integers(0, MAX_SHARDS - 1)
_segments = st.lists(
    st.text("ab0._-", min_size=1, max_size=3).filter(lambda s: s[0].isalnum()),
    min_size=2,
    max_size=4,
)
Triple = tuple[str, str, int | None]


@st.composite
def _two_triples(draw: st.DrawFn) -> tuple[Triple, Triple]:
    """Two (prefix, queue, shard), unrelated or one text cut at two of its ':' (the collision
    of "shop" + "eu:orders" with "shop:eu" + "orders")."""
    if draw(st.booleans()):
        return (draw(_names_of), draw(_names_of), draw(_shards)), (
            draw(_names_of),
            draw(_names_of),
            draw(_shards),
        )
    segments = draw(_segments)
    cuts = st.integers(1, len(segments) - 1)
    i, j = draw(cuts), draw(cuts)
    a = (":".join(segments[:i]), ":".join(segments[i:]), draw(_shards))
    return a, (":".join(segments[:j]), ":".join(segments[j:]), draw(_shards))


def _keys_or_reject(prefix: str, queue: str, shard: int | None) -> QueueKeys:
    try:
        return QueueKeys(prefix, queue, shard)
    except ConfigurationError:
        reject()  # a name refused with a clear error shares nothing


def _names(keys: QueueKeys) -> set[str]:
    return {*keys.all_keys(), keys.wake_channel, keys.task_result("x")}


@given(pair=_two_triples())
def test_no_two_queues_or_shards_share_a_key_whatever_their_prefixes(
    pair: tuple[Triple, Triple],
) -> None:
    a, b = pair
    ka, kb = _keys_or_reject(*a), _keys_or_reject(*b)
    if a == b:
        assert _names(ka) == _names(kb)
    else:
        assert ka.tag != kb.tag and not _names(ka) & _names(kb)
    # A site's published schedules are no queue's key, of its own site or another.
    assert not {published_recurrences_key(a[0]), f"{published_recurrences_key(a[0])}:lock"} & (
        _names(ka) | _names(kb)
    )


@given(prefix=_names_of, queue=st.text(_ALPHABET, min_size=1, max_size=6))
def test_every_name_is_either_refused_or_parsed_back_from_its_tag(prefix: str, queue: str) -> None:
    try:
        keys = QueueKeys(prefix, queue)
    except ConfigurationError:
        assert ":" in queue or not queue[0].isalnum()
        return
    # The queue is what follows the last ':' of the tag, the prefix what precedes it.
    found_prefix, _, found_queue = keys.tag[1:-1].rpartition(":")
    assert (found_prefix, found_queue) == (prefix, queue)


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
