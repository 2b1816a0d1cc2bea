"""django_delayqueue.core.bound: schedule()'s pre-encoded calls on a pooled connection."""

from __future__ import annotations

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, ScriptFailed
from django_delayqueue.core.bound import BoundScript, encode_arguments
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
    redis_client.client_kill_filter(_id=producer.client_id())  # the pool's only connection
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
