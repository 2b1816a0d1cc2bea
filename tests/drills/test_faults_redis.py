"""Fault drills on Redis itself, each on a redis-server of its own: kill -9 with an fsync'd AOF
and restart, clean restart, SCRIPT FLUSH, CLIENT KILL and CLIENT PAUSE, Redis stopped.

Each drill runs two consumer processes and a producer thread that schedules messages with
explicit ids while the fault happens. A schedule that fails is retried with the same id (the
idempotent pattern callers are told to use); every id whose schedule was acknowledged must be
delivered, none early, and every duplicate must overlap the outage the test caused.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from drill import consumers, producer, settled
from ledger import Causes, check, read

from django_delayqueue.core import DelayQueueError, RedisUnavailable
from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow

AOF = ("--appendonly", "yes", "--appendfsync", "always")
VISIBILITY = 2


@pytest.fixture
def server() -> Iterator[RedisServerProcess]:
    with RedisServerProcess(args=AOF) as s:
        yield s


def _admin(server: RedisServerProcess) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=10)


class Producer(threading.Thread):
    """Schedules ``count`` messages, retrying each failed one with the same id and due time."""

    def __init__(self, url: str, count: int, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.queue = producer(url, "drill")
        self.count = count
        self.interval = interval
        self.acknowledged: dict[str, int] = {}
        self.errors: list[str] = []
        self.rng = random.Random(7)

    def run(self) -> None:
        for i in range(self.count):
            at = self.queue.clock.now_ms() + self.rng.randint(0, 800)
            message_id = f"p{i}"
            for _ in range(400):  # bounded: about 20 s of retrying one message
                try:
                    result = self.queue.schedule({"i": i}, at=at, id=message_id)
                except DelayQueueError as e:
                    self.errors.append(str(e))
                    time.sleep(0.05)
                    continue
                self.acknowledged[message_id] = result.due_ms
                break
            time.sleep(self.interval)


def _drill(
    server: RedisServerProcess, tmp_path: Path, fault: Callable[[], None], count: int = 200
) -> tuple[Producer, list[int], tuple[int, int]]:
    """Consumers + producer; ``fault`` runs once some messages flowed. Returns what happened."""
    ledger_path = tmp_path / "ledger.jsonl"
    with consumers(
        server.url, "drill", tmp_path, ledger=ledger_path, visibility=VISIBILITY, socket_timeout=5
    ) as cs:
        procs = [cs.start(concurrency=2, claim_batch=10) for _ in range(2)]
        feed = Producer(server.url, count)
        feed.start()
        cs.wait(lambda: len(read(ledger_path)) >= 20, 30, "deliveries before the fault")
        start = int(time.time() * 1000)
        fault()
        end = int(time.time() * 1000)
        feed.join(60)
        assert not feed.is_alive(), "the producer never got its messages in"
        q = producer(server.url, "drill")
        # Some messages surely due after the fault: the same consumers must pick them up.
        for i in range(5):
            r = q.schedule({"post": i}, delay=1.2, id=f"post{i}")
            feed.acknowledged[r.id] = r.due_ms
        cs.wait(lambda: settled(q), 60, "every message delivered after the fault")
        # They survived the fault by themselves and still stop gracefully.
        assert [cs.stop(p) for p in procs] == [0, 0], cs.logs()[-3000:]
        late = [d for d in read(ledger_path) if d.delivered_ms > end + 1000]
        assert {d.pid for d in late} <= {p.pid for p in procs}
        assert late, "no delivery after the fault: the consumers did not reconnect"
    assert len(feed.acknowledged) == count + 5
    assert q.counts()["garbage"] == 0
    report = check(
        feed.acknowledged,
        read(ledger_path),
        Causes(outages=[(start, end)], outage_margin_ms=VISIBILITY * 1000 + 1000),
    )
    assert report.ok, report.summary()
    return feed, [p.pid for p in procs], (start, end)


def test_kill_9_redis_with_fsynced_aof_loses_no_acknowledged_schedule(
    server: RedisServerProcess, tmp_path: Path
) -> None:
    def crash() -> None:
        server.kill()
        time.sleep(1.0)
        server.restart()

    feed, _, _ = _drill(server, tmp_path, crash)
    # The producer saw the outage, so the drill really tested retried schedules.
    assert any("Redis unavailable" in e for e in feed.errors)


def test_clean_restart_and_script_flush_while_consumers_run(
    server: RedisServerProcess, tmp_path: Path
) -> None:
    def restart() -> None:
        admin = _admin(server)
        admin.script_flush()
        time.sleep(0.5)
        with contextlib.suppress(redis.ConnectionError):  # it closes our connection as it goes
            admin.shutdown(save=True)
        server.restart()
        _admin(server).script_flush()  # a freshly started Redis knows no scripts anyway

    _drill(server, tmp_path, restart)


def test_client_kill_and_client_pause_are_survived(
    server: RedisServerProcess, tmp_path: Path
) -> None:
    def cut_and_pause() -> None:
        admin = _admin(server)
        assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal") >= 2
        admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        time.sleep(0.5)
        admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")
        time.sleep(2.5)

    _drill(server, tmp_path, cut_and_pause)


def test_schedule_while_redis_is_down_raises_a_clear_error(
    server: RedisServerProcess,
) -> None:
    q = producer(server.url, "drill")
    assert q.schedule({"before": True}).created
    server.kill()
    with pytest.raises(RedisUnavailable, match="Redis unavailable during schedule") as info:
        q.schedule({"during": True})
    assert isinstance(info.value, DelayQueueError)
    server.restart()
    # Same client, no reconnect by hand: the next call works, and the first message survived.
    assert q.schedule({"after": True}).created
    assert q.counts()["ready"] == 2


def test_clock_synced_during_client_pause_is_never_ahead_of_redis(
    server: RedisServerProcess,
) -> None:
    """A consumer that (re)syncs its clock while Redis is paused must not run ahead of it.

    The TIME reply of a paused server comes late; taking the midpoint of that round trip as
    the server's reading put the clock up to half the pause ahead, so messages were delivered
    that much early. The clock now never reads later than the server's real time.
    """
    from django_delayqueue.core import RedisClock

    admin = _admin(server)
    client = redis.Redis.from_url(server.url, socket_timeout=10)
    client.ping()  # connected before the pause, as a running consumer is
    admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
    clock = RedisClock(client)
    now = clock.now_ms()
    seconds, micros = admin.time()  # answered once the pause is over
    assert now <= int(seconds) * 1000 + int(micros) // 1000
    # Same host, same kernel clock: the offset is a measurement error only, now tiny.
    assert abs(clock.now_ms() - time.time() * 1000) < 100
