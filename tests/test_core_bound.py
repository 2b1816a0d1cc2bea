"""django_delayqueue.core.bound: schedule()'s pre-encoded calls on a pooled connection."""

from __future__ import annotations

import multiprocessing
import os
import threading
import warnings
from typing import Any

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, ScriptFailed
from django_delayqueue.core.bound import (
    BoundScript,
    _kept_connection,
    _KeptConnection,
    _needs_command_name,
    encode_arguments,
)
from django_delayqueue.core.scripts import LuaScript
from django_delayqueue.redis_server import RedisServerProcess

ECHO = LuaScript("echo", "return {KEYS[1], unpack(ARGV)}", "")


def echo_script(client: redis.Redis) -> LuaScript:
    sha = client.script_load(ECHO.source)
    return LuaScript("echo", ECHO.source, sha)


def test_arguments_are_encoded_as_redis_bulk_strings() -> None:
    assert encode_arguments(["EVALSHA", 3, "café", b"\x00"]) == (
        b"$7\r\nEVALSHA\r\n$1\r\n3\r\n$5\r\ncaf\xc3\xa9\r\n$1\r\n\x00\r\n"
    )


def test_bound_arguments_come_first_and_replies_are_in_order(redis_client: redis.Redis) -> None:
    bound = BoundScript(echo_script(redis_client), redis_client, ["{t}:k"], ["fixed", 7])
    assert bound("a", 1) == [b"{t}:k", b"fixed", b"7", b"a", b"1"]
    replies = bound.call_many([["x"], ["y", "z"], []])
    assert replies == [
        [b"{t}:k", b"fixed", b"7", b"x"],
        [b"{t}:k", b"fixed", b"7", b"y", b"z"],
        [b"{t}:k", b"fixed", b"7"],
    ]


def test_a_script_error_raises_script_failed_naming_the_script(redis_client: redis.Redis) -> None:
    source = "return redis.error_reply('BOOM ' .. ARGV[1])"
    script = LuaScript("boom", source, redis_client.script_load(source))
    with pytest.raises(ScriptFailed, match=r"boom\.lua failed: BOOM now"):
        BoundScript(script, redis_client, ["{t}:k"], [])("now")


def test_schedule_after_script_flush_loads_the_script_and_runs_each_call_once(
    redis_client: redis.Redis,
) -> None:
    q = Queue(redis_client, "q", clock=ManualClock())
    q.schedule("before")
    redis_client.script_flush()
    assert q.schedule("one", id="one").created
    redis_client.script_flush()
    result = q.schedule_many([{"payload": i, "delay": 5} for i in range(1200)], chunk_size=100)
    assert (result.scheduled, result.duplicates) == (1200, 0)
    assert q.counts()["pending"] == 1200 and q.counts()["ready"] == 2


def test_a_killed_pooled_connection_is_replaced_and_nothing_is_lost_or_doubled(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    producer = redis.Redis.from_url(redis_server.url)
    q = Queue(producer, "q", clock=ManualClock())
    assert q.schedule("first").created
    # Every connection but the test's own: the one schedule() keeps checked out among them.
    redis_client.client_kill_filter(_type="normal", skipme=True)
    assert q.schedule("second", id="second").created
    assert q.counts()["ready"] == 2 and redis_client.hlen(q.keys.messages) == 2
    producer.close()


def test_other_clients_go_through_redis_py(redis_client: redis.Redis) -> None:
    class Instrumented(redis.Redis):
        sent: list[str] = []

        def execute_command(self, *args, **options):  # type: ignore[no-untyped-def]
            self.sent.append(str(args[0]))
            return super().execute_command(*args, **options)

    client = Instrumented(connection_pool=redis_client.connection_pool)
    q = Queue(client, "q", clock=ManualClock())
    assert q.schedule("through redis-py").created
    assert "EVALSHA" in Instrumented.sent


# --- the connection a bound script keeps checked out ----------------------------------------------


def test_queues_on_one_client_keep_one_connection_between_them(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    pool = client.connection_pool
    for name in ("a", "b", "c"):
        q = Queue(client, name, clock=ManualClock())
        for n in range(3):
            q.schedule(n)
    assert len(pool._in_use_connections) == 1  # kept between calls, shared by the queues
    assert q.counts()["ready"] == 3
    client.close()


@pytest.mark.parametrize("kind", ["blocking", "small"])
def test_a_small_or_blocking_pool_is_left_whole(
    redis_server: RedisServerProcess, redis_client: redis.Redis, kind: str
) -> None:
    if kind == "blocking":
        pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=1, timeout=2)
    else:
        pool = redis.ConnectionPool.from_url(redis_server.url, max_connections=1)
    client = redis.Redis(connection_pool=pool)
    q = Queue(client, "q", clock=ManualClock())
    q.schedule("first")
    # Had schedule() kept the pool's only connection, this would wait and fail ("blocking") or
    # fail at once with "Too many connections" ("small").
    assert q.counts()["ready"] == 1
    client.close()


def test_a_forked_process_takes_a_connection_of_its_own(
    redis_server: RedisServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = redis.ConnectionPool.from_url(redis_server.url)
    kept = _KeptConnection()
    parents = kept.get(pool)
    assert kept.get(pool) is parents
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as seen from a forked child
    assert kept.get(pool) is not parents
    pool.disconnect()


def test_threads_that_find_the_kept_connection_busy_use_the_pool(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    q = Queue(client, "q", clock=ManualClock())
    errors: list[BaseException] = []

    def produce(t: int) -> None:
        try:
            for n in range(200):
                assert q.schedule(n, id=f"t{t}-{n}").created
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert q.counts()["ready"] == 1600
    client.close()


def _schedule_in_child() -> None:
    client, parents = _FORKED["client"], _FORKED["connection"]
    q = Queue(client, "q", clock=ManualClock())
    created = q.schedule("from the child", id="child").created
    ours = _kept_connection(client.connection_pool)._connection  # type: ignore[union-attr]
    raise SystemExit(0 if created and ours is not parents else 1)


_FORKED: dict[str, Any] = {}


def test_a_forked_child_does_not_share_the_kept_connection(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    _FORKED["client"] = client
    q = Queue(client, "q", clock=ManualClock())
    assert q.schedule("before the fork", id="before").created  # keeps a connection
    _FORKED["connection"] = _kept_connection(client.connection_pool)._connection  # type: ignore[union-attr]
    assert _FORKED["connection"] is not None
    child = multiprocessing.get_context("fork").Process(target=_schedule_in_child)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert q.schedule("after the fork", id="after").created
    assert sorted(client.hkeys(q.keys.messages)) == [b"after", b"before", b"child"]
    client.close()


# --- redis-py versions ------------------------------------------------------------------------


class _CommandNamePool(redis.ConnectionPool):
    """A pool whose get_connection() needs a command name, as in redis-py 5.0 to 5.2."""

    def get_connection(self, command_name, *keys, **options):  # type: ignore[no-untyped-def,override]
        # Passed on only to a redis-py that wants it: 5.3 and later warn when given one.
        if _needs_command_name(redis.ConnectionPool):
            return super().get_connection(command_name)
        return super().get_connection()


def test_a_pool_that_needs_a_command_name_gets_one(redis_server: RedisServerProcess) -> None:
    # redis-py 5.0-5.2 (setup.cfg allows redis>=5.0) raised TypeError on get_connection().
    pool = _CommandNamePool.from_url(redis_server.url)
    client = redis.Redis(connection_pool=pool)
    q = Queue(client, "q", clock=ManualClock())
    assert q.schedule("first").created
    result = q.schedule_many([{"payload": n} for n in range(3)])
    assert result.scheduled == 3
    client.close()


def test_this_redis_py_gets_connections_without_a_deprecation_warning(
    redis_server: RedisServerProcess,
) -> None:
    # redis-py 5.3+ deprecates the command name: no warning (ours are errors under pytest).
    small = redis.Redis.from_url(redis_server.url, max_connections=2)  # a pool left whole
    default = redis.Redis.from_url(redis_server.url)  # a pool that keeps one connection
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n, client in enumerate((small, default)):
            assert Queue(client, "q", clock=ManualClock()).schedule(n, id=str(n)).created
    small.close()
    default.close()
