"""core.scripts.fast_path: schedule()'s pre-encoded calls on a kept pooled connection."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
import warnings
from typing import Any

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, ScriptFailed
from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.fast_path import (
    BoundScript,
    _kept_connection,
    _KeptConnection,
    _needs_command_name,
    encode_arguments,
)
from django_delayqueue.embedded import RedisServerProcess

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
    assert (result.scheduled, result.already_present) == (1200, 0)
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


# --- a connection that breaks in the middle of a batch ---------------------------------------


def _take_command(buffer: bytearray) -> bytes | None:
    """The first whole Redis protocol command in ``buffer`` (removed from it), or None."""
    end = buffer.find(b"\r\n")
    if end < 0:
        return None
    count, position = int(buffer[1:end]), end + 2
    for _ in range(count):
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        position = end + 2 + int(buffer[position + 1 : end]) + 2
        if position > len(buffer):
            return None
    command = bytes(buffer[:position])
    del buffer[:position]
    return command


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\r\n"):
        byte = sock.recv(1)  # slow, but only a handful of replies go through here
        if not byte:
            raise ConnectionError("upstream closed")
        line += byte
    return line


def _read_reply(sock: socket.socket) -> bytes:
    """One whole RESP2 or RESP3 reply (redis-py 6+ says HELLO 3 when it connects)."""
    line = _read_line(sock)
    kind, rest = line[:1], line[1:-2]
    if kind in b"$!=" and rest != b"-1":  # bulk strings: a length, then the bytes
        data = b""
        while len(data) < int(rest) + 2:
            data += sock.recv(int(rest) + 2 - len(data))
        return line + data
    if kind in b"*~>%|" and rest != b"-1":  # aggregates: so many replies (maps: pairs)
        count = int(rest) * (2 if kind in b"%|" else 1)
        line += b"".join(_read_reply(sock) for _ in range(count))
        return line + _read_reply(sock) if kind == b"|" else line  # attributes precede a reply
    return line


class CuttingProxy:
    """A TCP proxy to a real Redis whose first connection breaks after ``replies`` EVALSHAs.

    On that connection each command goes to Redis on its own and its one-line reply comes
    back; once ``replies`` EVALSHA replies have been passed on, the proxy closes the connection:
    the commands after them never reach Redis (as when a connection breaks mid-batch). Every
    later connection is passed through untouched.
    """

    def __init__(self, upstream_port: int, replies: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.replies = replies
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        first = True
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.upstream)
            target = self._cut_after if first else self._pass_through
            first = False
            threading.Thread(target=target, args=(client, upstream), daemon=True).start()

    def _cut_after(self, client: socket.socket, upstream: socket.socket) -> None:
        buffer, answered = bytearray(), 0
        with client, upstream:
            while answered < self.replies:
                command = _take_command(buffer)
                if command is None:
                    data = client.recv(65536)
                    if not data:
                        return
                    buffer += data
                    continue
                upstream.sendall(command)
                client.sendall(_read_reply(upstream))
                answered += command.split(b"\r\n", 3)[2].upper() == b"EVALSHA"
            self.cut.set()
            client.shutdown(socket.SHUT_WR)  # the replies already sent still arrive
            while client.recv(65536):  # until the client hangs up: no reset
                pass

    @staticmethod
    def _pass_through(client: socket.socket, upstream: socket.socket) -> None:
        def pipe(source: socket.socket, sink: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    sink.sendall(data)
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
        back.start()
        pipe(client, upstream)
        back.join()
        client.close()
        upstream.close()


COUNT = LuaScript("count", "return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)", "")


def test_a_batch_cut_mid_way_keeps_the_replies_read_and_sends_only_the_rest(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    script = LuaScript("count", COUNT.source, redis_client.script_load(COUNT.source))
    proxy = CuttingProxy(redis_server.port, replies=3)
    client = redis.Redis.from_url(proxy.url)
    bound = BoundScript(script, client, ["{t}:runs"], [])
    assert bound.call_many([[f"call{n}"] for n in range(8)]) == [1] * 8
    assert proxy.cut.is_set()
    # Each call ran exactly once: the three answered before the cut were not sent again.
    runs = redis_client.hgetall("{t}:runs")
    assert runs == {f"call{n}".encode(): b"1" for n in range(8)}
    client.close()
    proxy.close()


def test_schedule_many_cut_mid_way_counts_every_message_once(
    redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    redis_client.script_load(LuaScript.named("schedule").source)  # the cut sees only EVALSHA
    proxy = CuttingProxy(redis_server.port, replies=2)
    client = redis.Redis.from_url(proxy.url)
    q = Queue(client, "q", clock=ManualClock())
    result = q.schedule_many([{"payload": n, "id": f"m{n}"} for n in range(50)], chunk_size=10)
    assert proxy.cut.is_set()
    # Before: the 2 chunks answered before the cut were sent again and counted as duplicates.
    assert (result.scheduled, result.already_present) == (50, 0)
    assert redis_client.llen(q.keys.ready) == 50
    client.close()
    proxy.close()
