"""core.server_info: what real redis-servers, configured as a shop might, say about themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from memory_support import redis_binaries, server_of

from django_delayqueue.core.server_info import ServerInfo, read_servers
from django_delayqueue.embedded import RedisServerProcess, free_port, local_cluster


def one(client: redis.Redis) -> ServerInfo:
    (info,) = read_servers(client)
    return info


@pytest.fixture(params=redis_binaries())
def binary(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_embedded_server_is_recognised_and_evicts_nothing(binary: str) -> None:
    with server_of(binary) as (server, client):
        info = one(client)
    assert info.ok and info.address == f"127.0.0.1:{server.port}"
    assert info.embedded and info.policy == "noeviction" and not info.evicts
    assert (info.aof, info.snapshots, info.persistent, info.persistence) == (
        False,
        False,
        False,
        "none",
    )
    assert info.maxmemory == 0 and info.memory_percent is None and not info.out_of_memory
    assert info.version and info.used_memory and info.used_memory > 0


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "volatile-lru"])
def test_a_cache_policy_evicts(policy: str) -> None:
    args = ("--maxmemory", "3mb", "--maxmemory-policy", policy)
    with RedisServerProcess(args=args, mark_embedded=False) as server:
        client = redis.Redis.from_url(server.url)
        info = one(client)
        client.close()
    assert info.evicts and info.policy == policy and not info.embedded
    assert info.maxmemory == 3 * 1024 * 1024
    assert info.memory_percent is not None and 0 < info.memory_percent < 100


def test_aof_and_snapshots_are_persistence(binary: str) -> None:
    with server_of(binary, "--appendonly", "yes", "--appendfsync", "everysec") as (_, client):
        assert (one(client).aof, one(client).persistence) == (True, "AOF")
    with server_of(binary, "--save", "3600", "1") as (_, client):  # 6.2: not "3600 1"
        info = one(client)
    assert (info.aof, info.snapshots, info.persistent, info.persistence) == (
        False,
        True,
        True,
        "RDB",
    )


def test_where_config_is_not_allowed_snapshots_are_unknown_not_off(binary: str) -> None:
    # As on managed services: INFO answers, CONFIG does not.
    with server_of(binary) as (server, admin):
        admin.acl_setuser(
            "app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
        )
        app = redis.Redis(port=server.port, username="app", password="pw")
        info = one(app)
        app.close()
    assert info.ok and info.aof is False and info.snapshots is None
    assert info.persistent is None and info.persistence == "unknown"


def test_a_memory_that_is_full(binary: str) -> None:
    with server_of(binary) as (_, client):
        client.config_set("maxmemory", 1)
        info = one(client)
    assert info.out_of_memory and info.memory_percent is not None and info.memory_percent > 100


def test_a_server_that_is_down_is_reported_not_raised() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    info = one(client)
    assert not info.ok and info.unreachable and "Connection" in info.error
    assert not info.evicts and info.persistent is None


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServerProcess]]:
    with local_cluster() as nodes:
        yield nodes


@pytest.mark.slow
def test_every_primary_of_a_cluster_is_read(cluster: list[RedisServerProcess]) -> None:
    redis.Redis(port=cluster[1].port).config_set("maxmemory-policy", "allkeys-lfu")
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster[0].port)
    found = {info.address: info for info in read_servers(client)}
    client.close()
    assert set(found) == {f"127.0.0.1:{n.port}" for n in cluster}
    assert [a for a, info in found.items() if info.evicts] == [f"127.0.0.1:{cluster[1].port}"]


@pytest.mark.slow
def test_a_sentinel_client_reads_the_primary() -> None:
    from redis.sentinel import Sentinel
    from sentinel_support import SERVICE, SentinelGroup

    group = SentinelGroup().start()
    try:
        sentinel = Sentinel([tuple(h) for h in group.hosts], socket_timeout=2)
        client = sentinel.master_for(SERVICE)
        (info,) = read_servers(client)
        client.close()
    finally:
        group.stop()
    assert info.ok and info.policy == "noeviction"
    assert info.address == f"127.0.0.1:{group.primary.port} (sentinel service {SERVICE})"
