"""django_delayqueue.core.clock: one shared clock (Redis server time), injectable in tests."""

from __future__ import annotations

import time

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, RedisClock, SystemClock
from django_delayqueue.core import clock as clock_module
from django_delayqueue.core.clock import exact_now_ms, producer_now_ms

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


# --- anchored to the monotonic clock, with a reading for consumers and one for producers -------


class FakeTime:
    """Stands in for the ``time`` module: real time passes only when a test says so.

    ``wall_step`` is what an NTP step or a VM resume adds to the wall clock (``time.time()``)
    without any real time passing; the monotonic clock never sees it.
    """

    def __init__(self) -> None:
        self.real = 1_000.0  # seconds of real time
        self.wall_step = 0.0

    def time(self) -> float:
        return 1_700_000_000.0 + self.real + self.wall_step

    def monotonic(self) -> float:
        return self.real


class FakeServer:
    """TIME from a server clock ``offset_ms`` ahead of real time (always right)."""

    def __init__(self, fake: FakeTime, offset_ms: float = 0.0) -> None:
        self.fake = fake
        self.offset_ms = offset_ms

    def server_ms(self) -> float:
        return (1_700_000_000.0 + self.fake.real) * 1000 + self.offset_ms

    def time(self) -> tuple[int, int]:
        us = int(self.server_ms() * 1000)
        return us // 1_000_000, us % 1_000_000


@pytest.mark.parametrize("step", [3.0, -3.0])
def test_a_wall_clock_step_does_not_move_the_redis_clock(
    monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    fake = FakeTime()
    monkeypatch.setattr(clock_module, "time", fake)
    server = FakeServer(fake, offset_ms=HOUR_MS)
    clock = RedisClock(server, resync_seconds=3600)
    before = clock.now_exact_ms()
    fake.wall_step += step  # the host's wall clock jumps; no real time passes
    fake.real += 0.010  # then 10 ms of real time do
    # Before: time.time() + offset jumped with the wall clock (a +3 s step: 3 s early).
    assert clock.now_exact_ms() - before == pytest.approx(10, abs=0.01)
    assert abs(clock.now_ms() - server.server_ms()) <= 1


class SlowServer(FakeServer):
    """A server whose TIME reply takes ``rtt_ms``; it reads its clock ``read_at`` of the way."""

    def __init__(self, fake: FakeTime, rtt_ms: float, read_at: float) -> None:
        super().__init__(fake, offset_ms=-5_000)
        self.rtt_ms = rtt_ms
        self.read_at = read_at

    def time(self) -> tuple[int, int]:
        self.fake.real += self.rtt_ms * self.read_at / 1000
        reply = super().time()
        self.fake.real += self.rtt_ms * (1 - self.read_at) / 1000
        return reply


@pytest.mark.parametrize("read_at", [0.0, 0.3, 1.0])
def test_consumers_read_never_ahead_of_the_server_and_producers_never_behind(
    read_at: float,
) -> None:
    fake = FakeTime()
    server = SlowServer(fake, rtt_ms=2.0, read_at=read_at)
    clock = RedisClock(server, resync_seconds=3600, monotonic=fake.monotonic)
    clock.sync()
    for _ in range(5):
        fake.real += 0.0123
        true = server.server_ms()
        lower, upper = clock.now_exact_ms(), clock.now_upper_ms()
        # Within a microsecond: a double holds epoch milliseconds to about 0.24 us.
        assert lower <= true + 0.001 and clock.now_ms() <= true
        assert upper >= true - 0.001
        assert upper - lower == pytest.approx(2.0 + 0.001, abs=0.001)  # the round trip
        assert producer_now_ms(clock) == pytest.approx(clock.now_upper_ms(), abs=0.001)


def test_clocks_without_an_upper_reading_give_producers_their_exact_one() -> None:
    clock = ManualClock(1_000.25)
    assert clock.now_ms() == 1_000
    assert exact_now_ms(clock) == producer_now_ms(clock) == 1_000.25
    clock.advance(ms=2)
    assert (clock.now_ms(), clock.now_exact_ms()) == (1_002, 1_002.25)
    before = time.time() * 1000
    assert before <= producer_now_ms(SystemClock()) <= time.time() * 1000


# --- the server changes under the client (a failover) -------------------------------------------


class FailoverClient:
    """TIME from one of two real redis-servers, as a client sees it when a Sentinel failover or
    a cluster change moves it from one to the other. A host's clock cannot be set in a test, so
    each server's reply is shifted by an offset of its own (``offsets_ms``)."""

    def __init__(self, servers: list[redis.Redis], offsets_ms: list[float]) -> None:
        self.servers = servers
        self.offsets_ms = offsets_ms
        self.current = 0

    def time(self) -> tuple[int, int]:
        seconds, micros = self.servers[self.current].time()
        us = seconds * 1_000_000 + micros + round(self.offsets_ms[self.current] * 1000)
        return us // 1_000_000, us % 1_000_000

    def server_ms(self) -> float:
        seconds, micros = self.time()
        return seconds * 1000 + micros / 1000


@pytest.mark.parametrize("new_offset_ms", [5_000, -5_000])
def test_a_redis_clock_follows_a_failover_to_a_server_whose_clock_differs(
    redis_client: redis.Redis, new_offset_ms: int
) -> None:
    """The clock kept the old primary's offset until its next resync, up to a minute: with the
    new one 5 s behind, consumers read 5 s ahead of it (deliveries 5 s early); 5 s ahead,
    producers read 5 s behind it (due times 5 s early)."""
    from django_delayqueue.embedded import RedisServerProcess

    with RedisServerProcess() as other:
        second = redis.Redis.from_url(other.url)
        client = FailoverClient([redis_client, second], [0, new_offset_ms])
        clock = RedisClock(client)  # the defaults the library uses
        clock.sync()
        client.current = 1  # the failover
        # A second later (no timing involved: the check is due after at most one second).
        time.sleep(1.05)
        before = client.server_ms()
        consumer, producer = clock.now_exact_ms(), clock.now_upper_ms()
        after = client.server_ms()
        assert consumer <= after  # never ahead of the new server
        assert producer >= before  # never behind it
        assert before - 1_000 < consumer  # on the new server's clock, not 5 s away from it
        second.close()


def test_a_redis_clock_checks_the_server_once_a_check_interval_and_keeps_a_sample_that_agrees() -> (
    None
):
    fake = FakeTime()
    server = SlowServer(fake, rtt_ms=0.5, read_at=0.5)
    calls: list[float] = []
    original = server.time

    def counted() -> tuple[int, int]:
        calls.append(fake.real)
        return original()

    server.time = counted  # type: ignore[method-assign]
    clock = RedisClock(server, resync_seconds=3600, check_seconds=1.0, monotonic=fake.monotonic)
    clock.sync()
    synced = clock._sample
    assert len(calls) == 3
    for _ in range(10):  # readings within the interval: no round trip
        fake.real += 0.05
        clock.now_exact_ms()
    assert len(calls) == 3
    fake.real += 1.0
    clock.now_exact_ms()
    assert len(calls) == 4  # one TIME: the check
    assert clock._sample is synced  # it agreed: the tighter sample stays
    server.offset_ms += 2.0  # the server changed (or stepped): 2 ms off
    fake.real += 1.0
    lower, upper = clock.now_exact_ms(), clock.now_upper_ms()
    assert len(calls) == 4 + 1 + 3  # the check, then a full sync
    true = server.server_ms()
    assert lower <= true + 0.001 and upper >= true - 0.001
