"""A local Redis Cluster of three masters, started by the test that asks for it (module
scope), and queue names whose hash tags land on each master."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from django_delayqueue.embedded import RedisServerProcess, free_port

SLOTS = ((0, 5460), (5461, 10922), (10923, 16383))


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServerProcess]]:
    """Three masters; the cluster bus port is chosen too (port + 10000 may not be free)."""
    buses = [free_port() for _ in SLOTS]
    nodes: list[RedisServerProcess] = []
    try:
        for bus in buses:
            args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
            args += ("--cluster-node-timeout", "2000", "--cluster-port", str(bus))
            nodes.append(RedisServerProcess(args=args).start())
        for node, (first, last) in zip(nodes, SLOTS, strict=True):
            redis.Redis(port=node.port).execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        first_node = redis.Redis(port=nodes[0].port)
        for node, bus in zip(nodes[1:], buses[1:], strict=True):
            first_node.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus)
        deadline = time.monotonic() + 30
        while not all(
            redis.Redis(port=n.port).cluster("info")["cluster_state"] == "ok" for n in nodes
        ):
            assert time.monotonic() < deadline, "the cluster never reached state ok"
            time.sleep(0.1)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def spread_queues(client: RedisCluster, prefix: str = "dq") -> list[str]:
    """Queue names whose hash tags land on each of the three masters."""
    chosen: dict[int, str] = {}
    for i in range(200):
        name = f"shop-{i}"
        port = client.get_node_from_key(f"{{{prefix}:{name}}}:pending").port
        chosen.setdefault(port, name)
        if len(chosen) == len(SLOTS):
            return list(chosen.values())
    raise AssertionError("could not find queues on every node")
