"""A local Redis Cluster of three masters, started by the test: schedule, deliver and count
through ``redis.cluster.RedisCluster``, with queues spread over all three nodes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import cluster_support
import pytest
from cluster_support import spread_queues
from drill import consumers, settled
from ledger import Causes, check, read
from redis.cluster import RedisCluster

from django_delayqueue.core import Queue, QueueSettings, snapshots
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.monitoring.stats import gather

pytestmark = pytest.mark.slow

cluster = cluster_support.cluster  # the fixture: three masters started for this module


def test_queues_work_on_a_three_master_cluster(
    cluster: list[RedisServerProcess], tmp_path: Path
) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    names = spread_queues(client)
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
        assert all(s.consumers_alive for s in gather(queues))  # heartbeats reached every node
        assert cs.stop(proc) == 0
    report = check(expected, read(ledger_path))
    assert report.ok and report.delivered == len(expected), report.summary()
    stats = gather(queues)
    assert [s.counts["pending"] for s in stats] == [0, 0, 0]
    assert sum((s.outcomes or {}).get("ack", 0) for s in stats) == len(expected)
    assert not any(s.consumers_alive for s in stats)  # and left with the consumer


def test_replica_acknowledgement_asks_each_queue_s_own_primary(
    cluster: list[RedisServerProcess],
) -> None:
    from django_delayqueue.core.errors import NotReplicated
    from django_delayqueue.core.replication import ReplicaAck

    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    for name in spread_queues(client, prefix="acked"):
        q = Queue(client, name, prefix="acked", replicas=ReplicaAck(1, timeout_ms=50))
        # These masters have no replica: WAIT on the queue's node answers 0 (a keyless WAIT
        # through the cluster client would go to any node, or fail).
        with pytest.raises(NotReplicated, match="0 of 1"):
            q.schedule({"n": 1}, id="m")
        assert client.get(q.keys.replicated) == b"1"
        assert q.counts()["ready"] == 1  # written all the same; only not confirmed


@pytest.mark.django_db
def test_the_django_layer_runs_on_the_cluster_from_its_settings(
    cluster: list[RedisServerProcess], admin_client: object
) -> None:
    """``DELAYQUEUE["CLUSTER"] = True`` with REDIS_URL naming one node: dq.schedule, the real
    ``runqueue`` command (in burst mode), the admin overview, health and metrics."""
    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings

    import django_delayqueue as dq
    from django_delayqueue.conf.connection import get_client
    from django_delayqueue.monitoring.health import check_health

    probe = RedisCluster(host="127.0.0.1", port=cluster[1].port)
    names = spread_queues(probe, prefix="djc")
    probe.close()
    delayqueue = {
        **settings.DELAYQUEUE,
        "REDIS_URL": cluster[2].url,  # any node: the client finds the others
        "CLUSTER": True,
        "PREFIX": "djc",
        "QUEUES": {name: {"visibility_timeout": 5} for name in names},
        "OUTBOX": False,
    }
    seen: list[tuple[str, object]] = []

    def receiver(sender: str, message: object, **kwargs: object) -> None:
        seen.append((sender, message.payload))  # type: ignore[attr-defined]

    with override_settings(DELAYQUEUE=delayqueue):
        assert isinstance(get_client(), RedisCluster)
        for name in names:
            dq.topic(name).connect(receiver, dispatch_uid=f"cluster-{name}")
        try:
            for name in names:
                for n in range(5):
                    dq.schedule(name, {"queue": name, "n": n}, id=f"{name}-{n}", on_commit=False)
            # One queue per master: each queue's keys (and scripts) on its own node.
            client = get_client()
            ports = {client.get_node_from_key(dq.get_queue(n).keys.ready).port for n in names}
            assert len(ports) == 3
            overview = admin_client.get("/admin/django_delayqueue/queuemessage/")  # type: ignore[attr-defined]
            text = overview.content.decode()
            assert all(f'data-queue="{name}"' in text for name in names)
            assert "errornote" not in text
            call_command("runqueue", "--burst", "--name", "cluster-burst")
            expected = [(name, {"queue": name, "n": n}) for name in names for n in range(5)]
            assert len(seen) == len(expected) and all(item in seen for item in expected), seen
            _, report = check_health()
            assert report["checks"]["redis"]["ok"], report
            assert all(report["queues"][n]["counts"]["ready"] == 0 for n in names)
            metrics = admin_client.get("/delayqueue/metrics/")  # type: ignore[attr-defined]
            assert metrics.status_code == 200
            assert f'queue="{names[0]}"' in metrics.content.decode()
        finally:
            for name in names:
                dq.topic(name).disconnect(dispatch_uid=f"cluster-{name}")


@pytest.mark.django_db
def test_a_sharded_queue_spreads_over_the_masters_and_delivers_each_message_once(
    cluster: list[RedisServerProcess], admin_client: object
) -> None:
    """``QUEUES["order-close"]["shards"] = 3`` on the cluster: the shards land on several
    masters, ids keep their shard (idempotency, cancel by id), counts and the admin add the
    shards up, and ``runqueue`` delivers every message once, as the logical queue's."""
    from collections import Counter

    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings

    import django_delayqueue as dq
    from django_delayqueue.conf.connection import get_client
    from django_delayqueue.monitoring.stats import collect

    delayqueue = {
        **settings.DELAYQUEUE,
        "REDIS_URL": cluster[0].url,
        "CLUSTER": True,
        "PREFIX": "shardtest",
        "QUEUES": {"order-close": {"shards": 3, "visibility_timeout": 5}},
        "OUTBOX": False,
    }
    seen: list[tuple[str, str, str]] = []

    def receiver(sender: str, message: object, **kwargs: object) -> None:
        seen.append((sender, message.queue, message.id))  # type: ignore[attr-defined]

    with override_settings(DELAYQUEUE=delayqueue):
        queue = dq.get_queue("order-close")
        masters = {get_client().get_node_from_key(q.keys.ready).port for q in queue.shards}
        assert len(queue.shards) == 3 and len(masters) >= 2
        dq.topic("order-close").connect(receiver, dispatch_uid="sharded")
        try:
            ids = [f"order-{n}" for n in range(60)]
            for message_id in ids:
                dq.schedule("order-close", {"id": message_id}, id=message_id, on_commit=False)
            again = dq.schedule("order-close", {"id": "dup"}, id="order-7", on_commit=False)
            assert again == "order-7"
            assert dq.cancel("order-close", "order-59")
            (stats,) = collect(["order-close"])
            assert stats.counts["ready"] == 59
            assert all(q.counts()["ready"] for q in queue.shards)  # every shard holds some
            page = admin_client.get(  # type: ignore[attr-defined]
                "/admin/django_delayqueue/queuemessage/order-close/?state=ready"
            ).content.decode()
            assert "order-3" in page and "59" in page
            call_command("runqueue", "order-close", "--burst", "--name", "sharded-burst")
        finally:
            dq.topic("order-close").disconnect(dispatch_uid="sharded")
        delivered = Counter(message_id for _, _, message_id in seen)
        assert set(delivered) == set(ids[:59]) and set(delivered.values()) == {1}
        assert {(sender, name) for sender, name, _ in seen} == {("order-close", "order-close")}
        (stats,) = collect(["order-close"])
        assert stats.counts["ready"] == 0 and stats.queue == "order-close"


def test_flow_keys_work_on_a_three_master_cluster(cluster: list[RedisServerProcess]) -> None:
    """Keyed messages on every master: their per-key lists (named in the scripts, under the
    queue's hash tag) share the queue's slot, and key_concurrency holds there."""
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    for name in spread_queues(client):
        q = Queue(client, f"{name}-keys", settings=QueueSettings(key_concurrency=1))
        assert client.keyslot(q.keys.key_list("+33612345678")) == client.keyslot(q.keys.ready)
        for n in range(3):
            q.schedule({"n": n}, key="+33612345678")
        q.schedule({"other": True}, key="+33699999999")
        first = q.claim(10)
        assert sorted(m.key for m in first) == ["+33612345678", "+33699999999"]
        assert q.ack(*first) == 2
        (second,) = q.claim(10)
        assert (second.key, second.payload) == ("+33612345678", {"n": 1})
        q.ack(second)


@pytest.mark.django_db
def test_the_supervised_runqueue_delivers_on_the_cluster(
    cluster: list[RedisServerProcess], tmp_path: Path
) -> None:
    """The command users run, ``runqueue --processes 2`` (a supervisor forking its consumer
    processes), on a three-master cluster: six queues (two per master) and a queue of three
    shards, scheduled through the Django layer. Every message is delivered, none early, none
    twice at once (the ledger's start and end of every handler call); the consumer processes
    consume (no child dies at start, as they all did when the supervisor closed the cluster
    client they inherited)."""
    import json

    from django.conf import settings
    from django.test import override_settings
    from drill import Runqueues
    from ledger import overlaps, read_runs

    import django_delayqueue as dq

    probe = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    # Names of their own: the module's other tests share the cluster and the "dq" prefix.
    names = spread_queues(probe, base="sup") + spread_queues(probe, skip=1, base="sup")
    probe.close()
    assert len(set(names)) == 6
    queues = {name: {"visibility_timeout": 10, "concurrency": 2} for name in names}
    queues["drill-sharded"] = {"visibility_timeout": 10, "shards": 3}
    runqueues = Runqueues(
        cluster[1].url,
        tmp_path,
        env={
            "DRILL_CLUSTER": "1",
            "DRILL_QUEUES": json.dumps(queues),
            "DRILL_RECEIVE": json.dumps(list(queues)),
        },
    )
    delayqueue = {
        **settings.DELAYQUEUE,
        "REDIS_URL": cluster[1].url,
        "CLUSTER": True,
        "QUEUES": {**settings.DELAYQUEUE["QUEUES"], **queues},
        "OUTBOX": False,
    }
    expected: dict[str, int] = {}

    def schedule_batch(tag: str) -> None:
        with override_settings(DELAYQUEUE=delayqueue):
            for name in [*names, "drill-sharded"]:
                for n in range(10):
                    message_id = f"{tag}-{name}-{n}"
                    dq.schedule(name, {"n": n}, id=message_id, delay=(n % 4) * 0.1, on_commit=False)
                    expected[message_id] = 0
            sharded = dq.get_queue("drill-sharded")
            ports = {sharded.client.get_node_from_key(q.keys.ready).port for q in sharded.shards}
            assert len(ports) >= 2  # the shards are spread over masters

    def all_delivered() -> bool:
        return {d.id for d in read(runqueues.ledger)} >= set(expected)

    killed: set[int] = set()
    try:
        # Started first: the children wake for messages scheduled while they wait (cluster
        # pub/sub on each queue's node), then consume what is due.
        sup = runqueues.start("--processes", "2", queues=[*names, "drill-sharded"])
        forked = runqueues.consuming_children(sup, 2)
        schedule_batch("forked")
        runqueues.wait(all_delivered, 90, "every message delivered by forked children")
        # SIGHUP: each slot gets a fresh interpreter (the code on disk), which connects anew.
        sup.send_signal(signal.SIGHUP)
        runqueues.wait(lambda: not runqueues.children(sup) & forked, 90, "both slots replaced")
        runqueues.consuming_children(sup, 2)
        schedule_batch("fresh")
        runqueues.wait(all_delivered, 90, "every message delivered by fresh children")
        # A child killed: its replacement (forked by a supervisor that has forked and settled
        # through its own cluster client since) consumes too.
        victim = min(runqueues.children(sup))
        killed.add(victim)
        os.kill(victim, signal.SIGKILL)
        runqueues.wait(lambda: victim not in runqueues.children(sup), 30, "the kill reaped")
        runqueues.consuming_children(sup, 2)
        schedule_batch("replaced")
        runqueues.wait(all_delivered, 90, "every message delivered after the replacement")
        sup.terminate()
        assert sup.wait(60) == 0, runqueues.logs()[-4000:]
    finally:
        runqueues.close()
    report = check(expected, read(runqueues.ledger), Causes(killed_pids=killed))
    assert report.ok, report.summary()
    assert overlaps(read_runs(runqueues.ledger)) == []
    log = runqueues.logs()
    assert "Traceback" not in log and "died at start" not in log, log[-4000:]
