"""The one clock that due times and deadlines are compared against.

Producers and consumers on different hosts must agree on "now", so the default clock is the
Redis server's: it reads ``TIME`` once, keeps the offset to the local clock and re-reads it
now and then. Tests inject a :class:`ManualClock`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch, on the shared clock."""
        ...


def exact_now_ms(clock: Clock) -> float:
    """``clock``'s time with its fraction of a millisecond, for waits that must end on time.

    A wait computed from the whole milliseconds of :meth:`Clock.now_ms` overshoots by half a
    millisecond on average. A clock without ``now_exact_ms`` is read in whole milliseconds.
    """
    exact = getattr(clock, "now_exact_ms", None)
    return float(exact()) if exact is not None else float(clock.now_ms())


class SystemClock:
    """The local wall clock (for a single host, or when Redis time is not wanted)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def now_exact_ms(self) -> float:
        return time.time() * 1000


class RedisClock:
    """Redis server time, read with ``TIME`` and kept as an offset to the local clock."""

    def __init__(self, client: Any, resync_seconds: float = 60.0) -> None:
        self._client = client
        self._resync_seconds = resync_seconds
        self._offset_ms: float | None = None
        self._synced_at = 0.0
        self._lock = threading.Lock()

    def sync(self, samples: int = 3) -> None:
        """Measure the offset from the quickest of a few ``TIME`` round trips.

        Redis read its clock somewhere between our ``before`` and ``after``, so taking the
        offset against ``after`` can only make our "now" a little behind the server's, never
        ahead: a consumer using it may deliver a fraction of a round trip late but never
        early. The quickest sample bounds that error best; the first one also pays for
        connecting, and one sent during a ``CLIENT PAUSE`` waits for the pause to end.
        """
        best: tuple[float, float] | None = None
        for _ in range(samples):
            before = time.time()
            seconds, micros = self._client.time()
            after = time.time()
            server_ms = int(seconds) * 1000 + int(micros) / 1000
            if best is None or after - before < best[0]:
                best = (after - before, server_ms - after * 1000)
        assert best is not None
        with self._lock:
            self._offset_ms = best[1]
            self._synced_at = time.monotonic()

    def now_ms(self) -> int:
        return int(self.now_exact_ms())

    def now_exact_ms(self) -> float:
        if self._offset_ms is None or time.monotonic() - self._synced_at > self._resync_seconds:
            # Redis is down: keep the last offset (or none) rather than fail a read of the
            # time; the Redis call that follows reports the outage properly.
            with contextlib.suppress(Exception):
                self.sync()
        return time.time() * 1000 + (self._offset_ms or 0)


class ManualClock:
    """A clock that only moves when told to (for tests)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = int(start_ms)

    def now_ms(self) -> int:
        return self._now

    def set(self, ms: int) -> None:
        self._now = int(ms)

    def advance(self, seconds: float = 0.0, ms: int = 0) -> int:
        self._now += int(seconds * 1000) + int(ms)
        return self._now
