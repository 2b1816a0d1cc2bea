"""The one clock that due times and deadlines are compared against.

Producers and consumers on different hosts must agree on "now", so the default clock is the
Redis server's: it reads ``TIME`` once, keeps it relative to the local monotonic clock and
re-reads it now and then. Tests inject a :class:`ManualClock`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

from django_delayqueue.core.client import RedisClient

# How often a RedisClock reading makes sure the server has not changed (see RedisClock).
CHECK_SECONDS = 1.0


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch on the shared clock, never ahead of it (consumers)."""
        ...


def exact_now_ms(clock: Clock) -> float:
    """``clock``'s time with its fraction of a millisecond, for waits that must end on time.

    A wait computed from the whole milliseconds of :meth:`Clock.now_ms` overshoots by half a
    millisecond on average. A clock without ``now_exact_ms`` is read in whole milliseconds.
    Like ``now_ms`` it is never ahead of the shared clock: what a consumer compares due times
    against, so that nothing is delivered early.
    """
    exact = getattr(clock, "now_exact_ms", None)
    return float(exact()) if exact is not None else float(clock.now_ms())


def producer_now_ms(clock: Clock) -> float:
    """``clock``'s time for a producer: never *behind* the shared clock, fraction included.

    A due time is the instant the caller asked for on this reading, rounded up; a reading
    that could be behind the server (the consumer's) would put it up to a round trip early.
    A clock without ``now_upper_ms`` (:class:`SystemClock`, :class:`ManualClock`) has one
    reading, exact for both.
    """
    upper = getattr(clock, "now_upper_ms", None)
    return float(upper()) if upper is not None else exact_now_ms(clock)


class SystemClock:
    """The local wall clock (for a single host, or when Redis time is not wanted)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def now_exact_ms(self) -> float:
        return time.time() * 1000


class RedisClock:
    """Redis server time, read with ``TIME`` and kept relative to the local monotonic clock.

    Anchored to ``time.monotonic()``, not to the wall clock: an NTP step or a VM resume moves
    the wall clock (a +3 s step made a wall-clock offset 3 s ahead until the next resync, so
    consumers delivered 3 s early), never the monotonic one. The resync every
    ``resync_seconds`` corrects the slow drift between the two hosts' clocks and follows a
    step of the server's own clock. ``monotonic`` is injectable for tests.

    Two readings come from each sync: :meth:`now_exact_ms` (and ``now_ms``) never ahead of the
    server, for consumers, and :meth:`now_upper_ms` never behind it, for producers.

    The server itself can change under the client: a Sentinel failover, a cluster node
    replaced. Its clock is another host's, and the old offset would make consumers deliver
    early (or producers compute early due times) until the next resync. So every
    ``check_seconds`` one reading first reads ``TIME`` once and re-anchors (a full sync) when
    that reply falls outside what the current sample allows: a new server, or a step of its
    clock. One round trip a second at most; a reply that agrees changes nothing.
    """

    def __init__(
        self,
        client: RedisClient,
        resync_seconds: float = 60.0,
        *,
        check_seconds: float = CHECK_SECONDS,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._client = client
        self._resync_seconds = resync_seconds
        self._check_seconds = check_seconds
        # Looked up now, not as a default argument, so a test may patch time.monotonic.
        self._monotonic = monotonic or time.monotonic
        # The best sample of the last sync: the server's time (ms) and our monotonic clock (s)
        # just before and just after it was read. One tuple, so a reader never mixes two syncs.
        self._sample: tuple[float, float, float] | None = None
        self._checked_at = -math.inf  # monotonic time of the last check (or sync)
        self._checking = threading.Lock()  # one thread checks; the others read meanwhile

    def sync(self, samples: int = 3) -> None:
        """Measure the server's clock against ours from the quickest of a few ``TIME`` calls.

        Redis read its clock somewhere between our ``before`` and ``after``. Counting from
        ``after`` can only make "now" a little behind the server's, never ahead: a consumer
        may deliver a fraction of a round trip late but never early. Counting from ``before``
        can only make it ahead, never behind: a producer's due times are never early. The
        quickest sample bounds both errors best; the first one also pays for connecting, and
        one sent during a ``CLIENT PAUSE`` waits for the pause to end.
        """
        best: tuple[float, float, float] | None = None
        for _ in range(samples):
            before = self._monotonic()
            seconds, micros = self._client.time()
            after = self._monotonic()
            server_ms = int(seconds) * 1000 + int(micros) / 1000
            if best is None or after - before < best[2] - best[1]:
                best = (server_ms, before, after)
        self._sample = best
        self._checked_at = self._monotonic()

    def now_ms(self) -> int:
        return math.floor(self.now_exact_ms())

    def now_exact_ms(self) -> float:
        """The server's time, never ahead of it (as if it read its clock at ``after``)."""
        sample = self._current_sample()
        if sample is None:
            return time.time() * 1000
        server_ms, _, after = sample
        return server_ms + (self._monotonic() - after) * 1000

    def now_upper_ms(self) -> float:
        """The server's time, never behind it (as if it read its clock at ``before``).

        ``TIME`` drops the fraction of a microsecond, so one microsecond more.
        """
        sample = self._current_sample()
        if sample is None:
            return time.time() * 1000
        server_ms, before, _ = sample
        return server_ms + 0.001 + (self._monotonic() - before) * 1000

    def _current_sample(self) -> tuple[float, float, float] | None:
        sample = self._sample
        now = self._monotonic()
        if sample is None or now - sample[2] > self._resync_seconds:
            # Redis is down: keep the last sample (or none: the local wall clock) rather than
            # fail a read of the time; the Redis call that follows reports the outage properly.
            with contextlib.suppress(Exception):
                self.sync()
            sample = self._sample
        elif now - self._checked_at >= self._check_seconds and self._checking.acquire(False):
            try:
                self._check(sample)
            except Exception:  # Redis down: the sample stands (as above)
                pass
            finally:
                self._checking.release()
            sample = self._sample
        return sample

    def _check(self, sample: tuple[float, float, float]) -> None:
        """Read ``TIME`` once; re-anchor if the reply shows ``sample`` reads wrong now.

        The server read its clock at some instant between ``before`` and ``after`` and dropped
        the fraction of a microsecond. A consumer's reading at ``before`` above the reply (plus
        that microsecond) is ahead of the server; a producer's at ``after`` below it is behind.
        Either cannot happen on the server the sample was taken from (its clock unstepped).
        """
        self._checked_at = self._monotonic()
        before = self._monotonic()
        seconds, micros = self._client.time()
        after = self._monotonic()
        reply_ms = int(seconds) * 1000 + int(micros) / 1000
        server_ms, sample_before, sample_after = sample
        consumer_ms = server_ms + (before - sample_after) * 1000
        producer_ms = server_ms + 0.001 + (after - sample_before) * 1000
        if consumer_ms > reply_ms + 0.001 or producer_ms < reply_ms:
            self.sync()


class ManualClock:
    """A clock that only moves when told to (for tests).

    ``set()`` and the start accept a fraction of a millisecond (``now_exact_ms`` returns it,
    ``now_ms`` rounds it down), for tests of sub-millisecond rounding.
    """

    def __init__(self, start_ms: float = 1_700_000_000_000) -> None:
        self._now: float = start_ms

    def now_ms(self) -> int:
        return math.floor(self._now)

    def now_exact_ms(self) -> float:
        return float(self._now)

    def set(self, ms: float) -> None:
        self._now = ms

    def advance(self, seconds: float = 0.0, ms: int = 0) -> int:
        self._now += int(seconds * 1000) + int(ms)
        return self.now_ms()
