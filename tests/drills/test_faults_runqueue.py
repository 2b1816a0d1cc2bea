"""Fault drills on real ``manage.py runqueue`` processes (the command users run).

The processes (``drill.Runqueues``) load ``tests/support/drill_settings.py``: the demo project plus
``drill_app``, whose receiver for queue "drill" records every delivery in the ledger and then
does what the test asked (sleep, raise, exit). Same guarantees as the core drills: nothing
lost, every duplicate explained by what the test did.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from drill import Runqueues, producer, settled
from ledger import Causes, check, read, read_runs

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def runqueues(tmp_path: Path, redis_server: RedisServerProcess) -> Iterator[Runqueues]:
    group = Runqueues(redis_server.url, tmp_path)
    yield group
    group.close()


def test_runqueue_killed_mid_handler_loses_nothing(
    runqueues: Runqueues, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    q = producer(redis_server.url, "drill")
    due = {r.id: r.due_ms for r in (q.schedule({"n": i}) for i in range(8))}
    victim = runqueues.start(mode="sleep:60", concurrency="2", claim_batch="2")
    runqueues.wait(lambda: len(read(runqueues.ledger)) == 2, 30, "2 handlers running")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    rescuer = runqueues.start()
    runqueues.wait(lambda: settled(q), 40, "the queue to drain after kill -9")
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    report = check(due, read(runqueues.ledger), Causes(killed_pids={victim.pid}))
    assert report.ok and report.duplicates == {"consumer killed mid-handler": 2}, report.summary()
    first = {d.id: d.delivered_ms for d in read(runqueues.ledger) if d.attempt == 1}
    again = [d for d in read(runqueues.ledger) if d.attempt == 2]
    # After the 2 s visibility timeout (100 ms allowed from claim to the handler's first line).
    assert all(d.delivered_ms >= first[d.id] + 1900 for d in again)


def test_runqueue_sigterm_once_then_twice(
    runqueues: Runqueues, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    q = producer(redis_server.url, "drill")
    ids = [q.schedule({"do": "sleep:3"}).id for _ in range(2)]
    ids += [q.schedule({"n": i}).id for i in range(4)]
    graceful = runqueues.start(concurrency="2", claim_batch="6", visibility="10")
    runqueues.wait(lambda: len(read(runqueues.ledger)) == 2, 30, "2 handlers running")
    graceful.send_signal(signal.SIGTERM)
    assert graceful.wait(30) == 0
    counts = q.counts()
    assert counts["unack"] == 0 and counts["ready"] == 4, runqueues.logs()[-2000:]
    assert len(read(runqueues.ledger)) == 2  # the two in flight finished; nothing new began

    # Twice: handlers that would run a minute are abandoned at once; nothing is lost.
    stuck = [q.schedule({"do": "sleep:60"}).id for _ in range(2)]
    ids += stuck
    forced = runqueues.start(concurrency="2", claim_batch="2", visibility="2")
    runqueues.wait(
        lambda: {d.id for d in read(runqueues.ledger)} >= set(stuck), 30, "the stuck handlers"
    )
    forced.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert forced.poll() is None  # still finishing the in-flight handlers
    forced.send_signal(signal.SIGTERM)
    forced.wait(10)  # not the 60 s of the handlers nor the 30 s grace
    # Not lost: both are still in the queue, to be delivered again (in retry, ready or unack).
    assert all(redis_client.hexists(q.keys.messages, i) for i in stuck)
    counts = q.counts()
    assert counts["unack"] + counts["retry"] + counts["ready"] == 2 and counts["garbage"] == 0
    report = check(ids, read(runqueues.ledger), Causes(killed_pids={forced.pid}))
    assert report.ok, report.summary()


def test_runqueue_leaves_a_handler_that_outlives_grace_in_flight(
    runqueues: Runqueues, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """One SIGTERM, a handler that blocks for 10 minutes, --grace 1: exit 0 without waiting for
    it, its message still in flight (never given to another consumer while the handler runs),
    delivered again after its visibility timeout with its attempt counted; nothing lost."""
    q = producer(redis_server.url, "drill")
    stuck = q.schedule({"do": ["sleep:600", "ok"]}).id  # first in the ready list: runs first
    waiting = [q.schedule({"n": i}).id for i in range(3)]
    proc = runqueues.start("--grace", "1", concurrency="1", claim_batch="10", visibility="10")
    runqueues.wait(lambda: [d.id for d in read(runqueues.ledger)] == [stuck], 30, "stuck started")
    proc.send_signal(signal.SIGTERM)
    try:
        # A bound against hangs, not a timing check: waiting for the handler would take 600 s.
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError("runqueue waited for the handler:\n" + runqueues.logs()) from None
    assert code == 0, runqueues.logs()
    assert "grace period over" in runqueues.logs()

    # Still in flight with its attempt counted: not in retry or ready for another consumer.
    (held,) = q.peek("unack").messages
    assert (held.id, held.attempts) == (stuck, 1)
    # The three that never started are ready again, no attempt used.
    ready = q.peek("ready").messages
    assert [m.id for m in ready] == waiting and all(m.attempts == 0 for m in ready)
    assert q.counts() == {"pending": 0, "ready": 3, "unack": 1, "retry": 0, "garbage": 0}
    assert len(read(runqueues.ledger)) == 1  # nothing else started after the signal

    # Nothing lost: the next consumer delivers all four, the stuck one on its second attempt.
    rescuer = runqueues.start(concurrency="2")
    runqueues.wait(lambda: settled(q), 60, "the queue to drain")
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(60) == 0, runqueues.logs()
    deliveries = read(runqueues.ledger)
    report = check([stuck, *waiting], deliveries, Causes(outgraced_pids={proc.pid}))
    assert report.ok, report.summary()
    assert report.duplicates == {"handler outlived --grace (visibility timeout)": 1}
    assert [(d.attempt, d.ppid) for d in deliveries if d.id == stuck] == [  # runqueue: parent
        (1, proc.pid),
        (2, rescuer.pid),
    ]
    assert q.counts()["garbage"] == 0


def test_a_visibility_timeout_raised_while_a_handler_runs_never_runs_it_twice(
    runqueues: Runqueues, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """Issue 36: staff raised the visibility timeout (6 s to 60 s) while a 25 s handler ran;
    its consumer renewed the lease at the new, longer interval, the lease set with the old one
    ended first, and another process ran the message a second time at 8 s. Here 3 s raised to
    30 s, two runqueues, a 15 s handler: one run, acknowledged."""
    q = producer(redis_server.url, "drill")
    procs = [runqueues.start(concurrency="1", visibility="3") for _ in range(2)]
    for proc in procs:
        runqueues.wait(lambda p=proc: runqueues.consuming(p), 60, "both runqueues consuming")
    slow = q.schedule({"do": "sleep:15"}).id
    runqueues.wait(lambda: read(runqueues.ledger), 30, "the slow handler started")
    # What the admin publishes (mirror.queue_overrides.publish): the queue's config hash.
    redis_client.hset(q.keys.config, "visibility_timeout", "30")
    redis_client.hincrby(q.keys.config, "version", 1)
    runqueues.wait(lambda: settled(q) and read_runs(runqueues.ledger), 60, "the handler's end")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, runqueues.logs()
    assert runqueues.logs().count("settings now visibility_timeout=30") == 2
    deliveries = read(runqueues.ledger)
    assert [d.attempt for d in deliveries] == [1], runqueues.logs()[-4000:]
    report = check([slow], deliveries)
    assert report.ok and not report.duplicates, report.summary()
    assert q.counts()["garbage"] == 0


def test_runqueue_reconnects_after_redis_kill_9(runqueues: Runqueues, tmp_path: Path) -> None:
    aof = ("--appendonly", "yes", "--appendfsync", "always")
    with RedisServerProcess(args=aof) as server:
        runqueues.url = server.url
        q = producer(server.url, "drill")
        before = {r.id: r.due_ms for r in (q.schedule({"n": i}, delay=0.5) for i in range(5))}
        proc = runqueues.start(visibility="2")
        runqueues.wait(lambda: len(read(runqueues.ledger)) >= 5, 30, "deliveries before")
        pending = {r.id: r.due_ms for r in (q.schedule({"n": i}, delay=3) for i in range(5))}
        server.kill()
        outage = int(time.time() * 1000)
        time.sleep(1.0)
        server.restart()
        back = int(time.time() * 1000)
        after = {r.id: r.due_ms for r in (q.schedule({"n": i}) for i in range(5))}
        everything = {**before, **pending, **after}
        runqueues.wait(
            lambda: {d.id for d in read(runqueues.ledger)} >= set(everything), 60, "all, after"
        )
        assert proc.poll() is None  # the same process, reconnected by itself
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    report = check(everything, read(runqueues.ledger), Causes(outages=[(outage, back)]))
    assert report.ok and report.delivered == len(everything), report.summary()
