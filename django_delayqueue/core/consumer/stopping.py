"""A consumer's stop requests and its grace period.

The first request stops gracefully: nothing new starts, running handlers may finish within the
grace period. The second stops at once. Requests come from signal handlers, so asking only
counts and reads the clock: no lock, no Event (whose ``set()`` takes a lock that the main thread
may hold in the very frame the signal interrupted).
"""

from __future__ import annotations

import math
from collections.abc import Callable


class StopRequests:
    """How many stops were asked for, and until when running handlers may finish."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self.count = 0
        self._grace_deadline = math.inf  # set by the first request

    def request(self, grace_seconds: float) -> int:
        """Count one more request (safe from a signal handler); the first gives running
        handlers ``grace_seconds``. Returns the count."""
        self.count += 1
        if self.count == 1:
            self._grace_deadline = self._monotonic() + grace_seconds
        return self.count

    @property
    def stopping(self) -> bool:
        return self.count > 0

    @property
    def at_once(self) -> bool:
        """A second request: stop without waiting for running handlers."""
        return self.count > 1

    def grace_left(self) -> float:
        """Seconds left for running handlers to finish (infinite before any request)."""
        return max(0.0, self._grace_deadline - self._monotonic())
