"""``MIN_REPLICAS``: a schedule returns only once the replicas have it (core.replication), and
``DELAYQUEUE['SENTINEL']`` settings. A primary and a replica of our own; the replica is paused
with SIGSTOP (and resumed) to make it miss its acknowledgement, deterministically."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from memory_support import full

from django_delayqueue.conf.connection import make_client, replica_ack
from django_delayqueue.core import Queue
from django_delayqueue.core.errors import ConfigurationError, NotReplicated, RedisOutOfMemory
from django_delayqueue.core.replication import ReplicaAck
from django_delayqueue.core.scripts.fast_path import get_connection
from django_delayqueue.embedded import RedisServerProcess


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[RedisServerProcess, RedisServerProcess]]:
    # No 5 s wait before the first full sync (Redis 7's diskless default), and a client read
    # timeout well past the WAIT below: with redis-py 8.1 that WAIT timed out at the client.
    primary = RedisServerProcess(args=("--repl-diskless-sync-delay", "0")).start()
    replica = RedisServerProcess(args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    client = redis.Redis.from_url(primary.url, socket_timeout=30)
    try:
        client.set("sync", 1)
        assert client.execute_command("WAIT", 1, 10_000) == 1  # the replica is online
        yield primary, replica
    finally:
        client.close()
        replica.stop()
        primary.stop()


def queue_on(primary: RedisServerProcess, replicas: int = 1) -> Queue:
    client = redis.Redis.from_url(primary.url)
    return Queue(client, "replicated", replicas=ReplicaAck(replicas, timeout_ms=200))


def test_a_schedule_returns_once_the_replica_has_it(
    pair: tuple[RedisServerProcess, RedisServerProcess],
) -> None:
    primary, replica = pair
    q = queue_on(primary)
    result = q.schedule({"n": 1}, delay=60, id="safe")
    assert result.created
    copy = redis.Redis.from_url(replica.url)
    assert copy.zscore(q.keys.pending, "safe") == result.due_ms  # already there on return
    copy.close()


def test_a_schedule_with_a_uniqueness_window_waits_for_the_replica_too(
    pair: tuple[RedisServerProcess, RedisServerProcess],
) -> None:
    primary, replica = pair
    q = queue_on(primary)
    assert q.schedule({"n": 1}, delay=60, id="windowed", unique_for=60).created
    copy = redis.Redis.from_url(replica.url)
    assert copy.zscore(q.keys.unique, "windowed") is not None  # the window too, on return
    copy.close()
    refused = q.schedule({"n": 2}, delay=60, id="windowed", unique_for=60)
    assert (refused.created, refused.state, refused.within_window) == (False, "pending", True)


def test_a_full_primary_refuses_with_out_of_memory_and_never_says_not_replicated(
    pair: tuple[RedisServerProcess, RedisServerProcess],
) -> None:
    primary, _ = pair
    q = queue_on(primary)
    stored = q.schedule({"n": 1}, delay=60, id="before")
    with full(q.client):
        with pytest.raises(RedisOutOfMemory):
            q.schedule({"n": 2}, delay=60, id="refused")
        result = q.schedule_many([{"payload": 3, "id": "bulk"}])  # nothing to confirm
        assert [r.id for r in result.not_scheduled] == ["bulk"]
        with pytest.raises(NotReplicated, match="out of memory") as caught:
            q.confirm_replicas("the earlier schedule", stored)  # the probe write is refused
        assert caught.value.result == stored
    assert not q.client.hexists(q.keys.messages, "refused")


def test_a_replica_that_does_not_confirm_makes_the_schedule_raise_not_replicated(
    pair: tuple[RedisServerProcess, RedisServerProcess],
) -> None:
    primary, replica = pair
    q = queue_on(primary)
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            q.schedule({"n": 1}, delay=60, id="unsafe")
        # Written on the primary all the same: a retry creates nothing, and, once the replica
        # is back, returns (its probe write comes after the first attempt's).
        assert q.client.zscore(q.keys.pending, "unsafe") is not None
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    again = q.schedule({"n": 1}, delay=60, id="unsafe")
    assert not again.created and again.state == "pending"


def test_more_replicas_than_exist_never_confirm(
    pair: tuple[RedisServerProcess, RedisServerProcess],
) -> None:
    q = queue_on(pair[0], replicas=2)
    with pytest.raises(NotReplicated, match="1 of 2 replica"):
        q.schedule_many([{"payload": 1}, {"payload": 2}])


def test_bad_replica_settings_are_refused() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError):
            ReplicaAck(bad)  # type: ignore[arg-type]
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "MIN_REPLICAS": 0}):
        assert replica_ack() is None
    with override_settings(
        DELAYQUEUE={**settings.DELAYQUEUE, "MIN_REPLICAS": 2, "MIN_REPLICAS_TIMEOUT_SECONDS": 0.25}
    ):
        assert replica_ack() == ReplicaAck(2, 250)


@pytest.mark.parametrize(
    ("sentinel", "match"),
    [
        ("127.0.0.1:26379", "must be a dict"),
        ({"hosts": []}, "host, port"),
        ({"hosts": [["h", "not a port"]]}, "host, port"),
        ({"hosts": [["h", 1]], "servce_name": "x"}, "unknown key"),
    ],
)
def test_bad_sentinel_settings_are_reported_by_the_checks(sentinel: object, match: str) -> None:
    from django.core.checks import run_checks

    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "SENTINEL": sentinel}):
        # Ours only: Django 6.1's model checks would read the database (JSONField support).
        errors = [m for m in run_checks(tags=["delayqueue"]) if m.id == "delayqueue.E004"]
        with pytest.raises(ConfigurationError, match=match):
            make_client()
    assert any("SENTINEL" in e.msg for e in errors)


def test_not_replicated_carries_what_the_write_did(
    pair: tuple[RedisServerProcess, RedisServerProcess],
) -> None:
    q = queue_on(pair[0], replicas=2)  # one replica exists: never confirmed
    with pytest.raises(NotReplicated) as raised:
        q.schedule({"n": 1}, delay=60, id="told")
    result = raised.value.result
    assert result.id == "told" and result.created  # written on the primary, and it says so
    with pytest.raises(NotReplicated) as raised:
        q.schedule_many([{"payload": 1, "id": "b1"}])
    assert raised.value.result.scheduled == 1


def test_an_infinite_replica_timeout_is_a_configuration_error() -> None:
    for timeout in (float("inf"), float("nan"), 0, -1, "1"):
        changed = {"MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT_SECONDS": timeout}
        bad = override_settings(DELAYQUEUE={**settings.DELAYQUEUE, **changed})
        with bad, pytest.raises(ConfigurationError):
            replica_ack()


@pytest.mark.parametrize("call", ["schedule", "confirm"])
def test_a_replica_timeout_longer_than_the_socket_timeout_is_waited_out(
    redis_server: RedisServerProcess, redis_client: redis.Redis, call: str
) -> None:
    """WAIT answers when its own timeout is over: a client whose socket_timeout is shorter
    (redis-py 8 defaults it to 5 s) cut it short and reported Redis unavailable (after redis-py
    sent it all again on each retry) instead of NotReplicated. No replica here: WAIT blocks its
    whole 600 ms and answers 0."""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.2)
    q = Queue(client, "replicated", replicas=ReplicaAck(1, timeout_ms=600))
    try:
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            if call == "schedule":
                q.schedule({"n": 1}, delay=60, id="slow-ack")
            else:
                q.confirm_replicas("acknowledgements")
        if call == "schedule":  # written on the primary all the same
            assert redis_client.zscore(q.keys.pending, "slow-ack") is not None
    finally:
        client.close()


class ReadWithoutTimeout(redis.Connection):
    """A connection whose ``read_response`` takes no ``timeout``, as in older redis-py."""

    def read_response(  # type: ignore[override]
        self, disable_decoding: bool = False, *, disconnect_on_error: bool = True
    ) -> Any:
        return super().read_response(disable_decoding, disconnect_on_error=disconnect_on_error)


def test_a_long_wait_is_read_past_the_socket_timeout_on_an_older_redis_py_too(
    redis_server: RedisServerProcess,
) -> None:
    pool = redis.ConnectionPool.from_url(
        redis_server.url, socket_timeout=0.2, connection_class=ReadWithoutTimeout
    )
    client = redis.Redis(connection_pool=pool)
    q = Queue(client, "replicated", replicas=ReplicaAck(1, timeout_ms=600))
    try:
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            q.confirm_replicas("acknowledgements")
        # The socket's own timeout is back for the next command.
        connection = get_connection(pool)
        try:
            assert connection._sock.gettimeout() == 0.2
        finally:
            pool.release(connection)
    finally:
        client.close()
