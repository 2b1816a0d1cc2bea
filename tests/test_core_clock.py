"""django_delayqueue.core.clock: one shared clock (Redis server time), injectable in tests."""

from __future__ import annotations

import time

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, RedisClock, SystemClock

HOUR_MS = 3_600_000


class FakeTimeClient:
    """Answers TIME like redis-py does, with a server clock ``offset_ms`` ahead of ours."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms
        self.calls = 0
        self.down = False

    def time(self) -> tuple[int, int]:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("down")
        us = int(time.time() * 1_000_000) + self.offset_ms * 1000
        return us // 1_000_000, us % 1_000_000


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1_000)
    assert clock.now_ms() == 1_000
    assert clock.now_ms() == 1_000
    assert clock.advance(1.5) == 2_500
    assert clock.advance(ms=7) == 2_507
    clock.set(42)
    assert clock.now_ms() == 42


def test_system_clock_is_the_local_clock_in_ms() -> None:
    before = int(time.time() * 1000)
    now = SystemClock().now_ms()
    after = int(time.time() * 1000)
    assert before <= now <= after


def test_redis_clock_follows_the_server_not_the_host() -> None:
    client = FakeTimeClient(offset_ms=HOUR_MS)
    clock = RedisClock(client)
    local = time.time() * 1000
    # One hour ahead, give or take the (fake, in-process) round trip.
    assert abs(clock.now_ms() - local - HOUR_MS) < 1_000
    assert client.calls >= 1


def test_redis_clock_reads_time_once_then_keeps_the_offset() -> None:
    client = FakeTimeClient(offset_ms=-HOUR_MS)
    clock = RedisClock(client, resync_seconds=3600)
    clock.now_ms()
    synced = client.calls
    for _ in range(50):
        clock.now_ms()
    assert client.calls == synced  # no TIME round trip per reading


def test_redis_clock_resyncs_after_resync_seconds() -> None:
    client = FakeTimeClient(offset_ms=0)
    clock = RedisClock(client, resync_seconds=0)
    clock.now_ms()
    synced = client.calls
    client.offset_ms = 5 * HOUR_MS  # the server's clock was corrected
    time.sleep(0.01)
    assert clock.now_ms() - time.time() * 1000 > 4 * HOUR_MS
    assert client.calls > synced


def test_redis_clock_keeps_the_last_offset_while_redis_is_down() -> None:
    client = FakeTimeClient(offset_ms=HOUR_MS)
    clock = RedisClock(client, resync_seconds=0)
    clock.now_ms()
    client.down = True
    time.sleep(0.01)
    assert clock.now_ms() - time.time() * 1000 > HOUR_MS / 2


def test_redis_clock_without_any_sync_falls_back_to_local_time() -> None:
    client = FakeTimeClient(offset_ms=HOUR_MS)
    client.down = True
    local = time.time() * 1000
    assert abs(RedisClock(client).now_ms() - local) < HOUR_MS / 2


def test_redis_clock_on_the_real_server(redis_client: redis.Redis) -> None:
    seconds, micros = redis_client.time()
    server_ms = seconds * 1000 + micros // 1000
    now = RedisClock(redis_client).now_ms()
    # Same host, so the offset is tiny; what matters is that TIME was read and used.
    assert abs(now - server_ms) < 5_000


def test_queue_defaults_to_the_redis_clock(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q")
    assert isinstance(q.clock, RedisClock)


@pytest.mark.parametrize("delay,due", [(0, 1_000), (2, 3_000), (0.0015, 1_002)])
def test_queue_due_times_come_from_the_injected_clock(
    redis_client: redis.Redis, delay: float, due: int
) -> None:
    q = Queue(redis_client, "q", clock=ManualClock(1_000))
    assert q.schedule("x", delay=delay).due_ms == due
