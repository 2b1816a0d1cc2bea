"""A local Redis Cluster of three masters, started by the test: schedule, deliver and count
through ``redis.cluster.RedisCluster``, with queues spread over all three nodes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from drill import consumers, settled
from ledger import check, read
from redis.cluster import RedisCluster

from django_delayqueue.core import Queue, QueueSettings, snapshots
from django_delayqueue.embedded import RedisServerProcess, free_port
from django_delayqueue.monitoring.stats import gather

pytestmark = pytest.mark.slow

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


def _spread_queues(client: RedisCluster, prefix: str = "dq") -> list[str]:
    """Queue names whose hash tags land on each of the three masters."""
    chosen: dict[int, str] = {}
    for i in range(200):
        name = f"shop-{i}"
        port = client.get_node_from_key(f"{{{prefix}:{name}}}:pending").port
        chosen.setdefault(port, name)
        if len(chosen) == len(SLOTS):
            return list(chosen.values())
    raise AssertionError("could not find queues on every node")


def test_queues_work_on_a_three_master_cluster(
    cluster: list[RedisServerProcess], tmp_path: Path
) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    names = _spread_queues(client)
    settings = QueueSettings(visibility_timeout=5)
    queues = [Queue(client, name, settings=settings) for name in names]
    for q in queues:
        slots = {client.keyslot(k) for k in [*q.keys.all_keys(), q.keys.wake_channel]}
        assert len(slots) == 1, f"keys of {q.name} span slots {slots}"
    assert len({client.get_node_from_key(q.keys.ready).port for q in queues}) == 3

    expected: dict[str, int] = {}
    for q in queues:
        for n in range(10):
            r = q.schedule({"n": n}, delay=n * 0.05)
            expected[r.id] = r.due_ms
        bulk = q.schedule_many({"payload": {"bulk": n}, "id": f"{q.name}-{n}"} for n in range(20))
        assert bulk.scheduled == 20
        assert not q.schedule({"again": True}, id=f"{q.name}-0").created  # idempotent here too
        expected.update(dict.fromkeys((f"{q.name}-{n}" for n in range(20)), 0))

    # Counts through the core (one pipeline over three nodes) and the admin's stats function.
    for snap in snapshots(queues):
        assert sum(snap.counts.values()) == 30 and snap.counts["garbage"] == 0
    for stats in gather(queues):
        assert stats.ok, stats.error
        assert sum(c or 0 for c in stats.counts.values()) == 30

    ledger_path = tmp_path / "ledger.jsonl"
    url = f"redis://127.0.0.1:{cluster[0].port}/0"
    with consumers(url, names, tmp_path, ledger=ledger_path, cluster=True) as cs:
        proc = cs.start(concurrency=2)
        cs.wait(lambda: all(settled(q) for q in queues), 60, "the cluster queues to drain")
        # A message scheduled while the consumer sleeps wakes it through cluster pub/sub.
        late = queues[2].schedule({"late": True}, delay=0.2)
        expected[late.id] = late.due_ms
        cs.wait(lambda: late.id in {d.id for d in read(ledger_path)}, 30, "the late message")
        cs.wait(lambda: settled(queues[2]), 30, "the late message's ack")
        assert cs.stop(proc) == 0
    report = check(expected, read(ledger_path))
    assert report.ok and report.delivered == len(expected), report.summary()
    stats = gather(queues)
    assert [s.counts["pending"] for s in stats] == [0, 0, 0]
    assert sum((s.outcomes or {}).get("ack", 0) for s in stats) == len(expected)
    assert all(s.consumers_alive for s in stats)  # heartbeats reached every node


def test_replica_acknowledgement_asks_each_queue_s_own_primary(
    cluster: list[RedisServerProcess],
) -> None:
    from django_delayqueue.core.errors import NotReplicated
    from django_delayqueue.core.replication import ReplicaAck

    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    for name in _spread_queues(client, prefix="acked"):
        q = Queue(client, name, prefix="acked", replicas=ReplicaAck(1, timeout_ms=50))
        # These masters have no replica: WAIT on the queue's node answers 0 (a keyless WAIT
        # through the cluster client would go to any node, or fail).
        with pytest.raises(NotReplicated, match="0 of 1"):
            q.schedule({"n": 1}, id="m")
        assert client.get(q.keys.replicated) == b"1"
        assert q.counts()["ready"] == 1  # written all the same; only not confirmed
