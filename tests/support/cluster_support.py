"""A local Redis Cluster of three masters, started by the test that asks for it (module
scope), and queue names whose hash tags land on each master."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from django_delayqueue.embedded import CLUSTER_SLOTS, RedisServerProcess, local_cluster

SLOTS = CLUSTER_SLOTS


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServerProcess]]:
    """Three masters (django_delayqueue.embedded.local_cluster), for the module's tests."""
    with local_cluster() as nodes:
        yield nodes


def spread_queues(
    client: RedisCluster, prefix: str = "dq", skip: int = 0, base: str = "shop"
) -> list[str]:
    """Queue names (``base-N``) whose hash tags land on each of the three masters (``skip``:
    pass over that many names per master first, for a second set of queues)."""
    chosen: dict[int, str] = {}
    passed: dict[int, int] = {}
    for i in range(200):
        name = f"{base}-{i}"
        port = client.get_node_from_key(f"{{{prefix}:{name}}}:pending").port
        if passed.get(port, 0) < skip:
            passed[port] = passed.get(port, 0) + 1
            continue
        chosen.setdefault(port, name)
        if len(chosen) == len(SLOTS):
            return list(chosen.values())
    raise AssertionError("could not find queues on every node")
