"""Fault drills on the consumer process: kill -9, SIGTERM once and twice, slow and poison handlers.
Real consumer subprocesses (``tests/support/programs/fault_consumer.py``), the session's
redis-server (flushed around each test), and an exact ledger of deliveries
(``tests/support/ledger.py``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from drill import consumers, producer, settled
from ledger import Causes, check, read

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


def _pids(path: Path) -> set[int]:
    return {d.pid for d in read(path)}


def test_kill_9_mid_handler_redelivers_after_visibility_timeout(
    redis_server: RedisServerProcess, redis_client: redis.Redis, ledger_path: Path, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "drill")
    due = {r.id: r.due_ms for r in (q.schedule({"n": i}) for i in range(10))}
    with consumers(redis_server.url, "drill", tmp_path, ledger=ledger_path, visibility=1.5) as cs:
        victim = cs.start(mode="sleep:60", concurrency=4, claim_batch=4)
        cs.wait(lambda: len(read(ledger_path)) == 4, 15, "4 deliveries in flight")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert q.counts()["unack"] == 4  # still invisible: nobody acked them
        killed_at = time.time() * 1000
        rescuer = cs.start(mode="ok")
        cs.wait(lambda: settled(q), 30, "the queue to drain after the kill")
        cs.stop(rescuer)
    deliveries = read(ledger_path)
    report = check(due, deliveries, Causes(killed_pids={victim.pid}))
    assert report.ok, report.summary()
    assert report.duplicates == {"consumer killed mid-handler": 4}
    again = [d for d in deliveries if d.attempt == 2]
    assert len(again) == 4 and all(d.pid == rescuer.pid for d in again)
    first = {d.id: d.delivered_ms for d in deliveries if d.attempt == 1}
    # Back only once the visibility deadline (claim + 1.5 s, or later if extended) passed;
    # 100 ms allowed between the claim and the handler's first line in the ledger.
    assert all(d.delivered_ms >= first[d.id] + 1400 for d in again)
    assert all(d.delivered_ms >= killed_at for d in again)
    assert q.counts()["garbage"] == 0 and redis_client.hlen(q.keys.messages) == 0


def test_sigterm_once_finishes_in_flight_and_gives_back_the_rest(
    redis_server: RedisServerProcess, redis_client: redis.Redis, ledger_path: Path, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "drill")
    ids = [q.schedule({"n": i}).id for i in range(6)]
    with consumers(redis_server.url, "drill", tmp_path, ledger=ledger_path) as cs:
        proc = cs.start(mode="sleep:3", concurrency=2, claim_batch=6, visibility=5)
        cs.wait(lambda: len(read(ledger_path)) == 2, 15, "2 deliveries in flight")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        first_two = {d.id for d in read(ledger_path)}
        assert len(read(ledger_path)) == 2  # nothing new started after SIGTERM
        counts = q.counts()
        # The two in-flight handlers finished and were acked; the four others are back.
        assert counts == {"pending": 0, "ready": 4, "unack": 0, "retry": 0, "garbage": 0}
        assert {m.id for m in q.peek("ready").messages} == set(ids) - first_two
        rescuer = cs.start(mode="ok", burst=True)
        assert rescuer.wait(20) == 0
    report = check(ids, read(ledger_path))
    assert report.ok and not report.duplicates, report.summary()
    # Given back without using up an attempt.
    assert all(d.attempt == 1 for d in read(ledger_path))


def test_sigterm_twice_exits_at_once_and_loses_nothing(
    redis_server: RedisServerProcess, redis_client: redis.Redis, ledger_path: Path, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "drill")
    ids = [q.schedule({"n": i}).id for i in range(6)]
    with consumers(redis_server.url, "drill", tmp_path, ledger=ledger_path) as cs:
        proc = cs.start(mode="sleep:60", concurrency=2, claim_batch=6, visibility=2)
        cs.wait(lambda: len(read(ledger_path)) == 2, 15, "2 deliveries in flight")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert proc.poll() is None  # the first SIGTERM waits for the 60 s handlers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0  # not the 60 s of the handlers, nor the 30 s grace
        rescuer = cs.start(mode="ok")
        cs.wait(lambda: settled(q), 30, "the queue to drain after the forced stop")
        cs.stop(rescuer)
    report = check(ids, read(ledger_path), Causes(killed_pids={proc.pid}))
    assert report.ok, report.summary()
    assert sum(report.duplicates.values()) == 2  # only the two abandoned handlers, again
    assert redis_client.hlen(q.keys.messages) == 0


def test_handler_slower_than_visibility_timeout_is_extended_not_redelivered(
    redis_server: RedisServerProcess, redis_client: redis.Redis, ledger_path: Path, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "drill")
    # Two visibility timeouts of 3 s pass while the handlers run; the extender pushes the
    # deadline out every second, so only a stall of two seconds could lapse one.
    ids = [q.schedule({"do": "sleep:7"}).id for _ in range(2)]
    with consumers(
        redis_server.url, "drill", tmp_path, ledger=ledger_path, visibility=3, maintenance=0.2
    ) as cs:
        # Two consumers: if a deadline ever lapsed, the idle one would reap and take it.
        busy = cs.start(concurrency=2, claim_batch=2)
        cs.wait(lambda: len(read(ledger_path)) == 2, 15, "both slow handlers running")
        idle = cs.start()
        cs.wait(lambda: settled(q), 30, "the slow handlers to finish")
        cs.stop(busy)
        cs.stop(idle)
        assert "timed out" not in cs.logs()
    report = check(ids, read(ledger_path))  # no causes: any duplicate is unexplained
    assert report.ok and report.delivered == 2, report.summary()


def test_handler_that_always_raises_ends_in_garbage_after_max_attempts(
    redis_server: RedisServerProcess, redis_client: redis.Redis, ledger_path: Path, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "drill")
    poison = q.schedule({"do": "raise"}).id
    healthy = [q.schedule({"n": i}).id for i in range(3)]
    with consumers(redis_server.url, "drill", tmp_path, ledger=ledger_path, max_attempts=3) as cs:
        proc = cs.start()
        cs.wait(lambda: q.counts()["garbage"] == 1 and settled(q), 30, "poison in garbage")
        cs.stop(proc)
    attempts = [d.attempt for d in read(ledger_path) if d.id == poison]
    assert attempts == [1, 2, 3]
    report = check([poison, *healthy], read(ledger_path))
    assert report.ok and report.duplicates == {"handler raised (retry)": 2}, report.summary()
    (dead,) = q.peek("garbage").messages
    assert dead.id == poison and dead.attempts == 3
    assert "no attempts left (3 of 3)" in dead.reason and "drill: failing" in dead.reason


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_handler_that_kills_its_process_ends_in_garbage(
    how: str,
    redis_server: RedisServerProcess,
    redis_client: redis.Redis,
    ledger_path: Path,
    tmp_path: Path,
) -> None:
    q = producer(redis_server.url, "drill")
    poison = q.schedule({"do": how}).id
    with consumers(
        redis_server.url, "drill", tmp_path, ledger=ledger_path, max_attempts=3, visibility=1
    ) as cs:
        # A supervisor restarts the consumer whenever it dies, as systemd would.
        proc = cs.start()
        deadline = time.monotonic() + 40
        while q.counts()["garbage"] == 0:
            assert time.monotonic() < deadline, "the poison message never reached garbage"
            if proc.poll() is not None:
                assert proc.returncode in (3, -signal.SIGKILL)
                proc = cs.start()
            time.sleep(0.05)
        # Not an endless loop: the consumer now lives on and the message stays dead.
        time.sleep(1.5)
        assert proc.poll() is None
        cs.stop(proc)
    deliveries = [d for d in read(ledger_path) if d.id == poison]
    assert [d.attempt for d in deliveries] == [1, 2, 3]
    assert len({d.pid for d in deliveries}) == 3 and os.getpid() not in _pids(ledger_path)
    (dead,) = q.peek("garbage").messages
    assert dead.id == poison and "last attempt (3 of 3)" in dead.reason
