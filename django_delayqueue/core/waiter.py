"""Sleeping until the next due time, and starting the claim early enough to be on time.

Two costs stand between a due time and the start of its handler: waking up (a ``select()``
timeout overshoots by a few tenths of a millisecond) and the promote + claim round trip. The
consumer therefore wakes one *claim lead* before the time it aims at, claims what is due by
that time, and the handler thread waits out the rest (:func:`sleep_until_due`): the handler
starts on time and never early, and the message waits those last milliseconds safe in the
unack set. The lead is the slowest recent wake-to-claimed cost plus a margin, never more than
``MAX_CLAIM_LEAD_MS``; a cancel in those last milliseconds finds the message already claimed,
as it would a moment after its due time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .clock import Clock, exact_now_ms
from .envelope import to_str
from .scripts import redis_errors

logger = logging.getLogger(__name__)

MAX_CLAIM_LEAD_MS = 5.0
# Covers what the measured cost leaves out: handing the batch to a handler thread.
CLAIM_LEAD_MARGIN_MS = 0.5
FIRST_CLAIM_LEAD_MS = 1.5  # until a round has been measured
WAIT_SLICE_SECONDS = 0.25  # short slices keep signals responsive; they cost no Redis commands


class ClaimLead:
    """How long before a due time the consumer starts the round trip that claims it."""

    def __init__(self, cap_ms: float = MAX_CLAIM_LEAD_MS, window: int = 32) -> None:
        self.cap_ms = cap_ms
        self._costs: deque[float] = deque([FIRST_CLAIM_LEAD_MS], maxlen=window)

    @property
    def ms(self) -> float:
        # The slowest recent cost, not the average: a claim that lands late makes its message
        # late, one that lands early only makes a handler thread wait a little.
        return min(self.cap_ms, max(self._costs) + CLAIM_LEAD_MARGIN_MS)

    def observe(self, cost_ms: float) -> None:
        """Record how long one round took from the planned wake to the claimed messages."""
        self._costs.append(max(0.0, cost_ms))


class Wake(NamedTuple):
    """Why and when a wait ended."""

    due_ms: int | None  # the due time the next claim aims at; None: woken for a poll
    planned_ms: float  # when the wait meant to end (due time less the claim lead)
    announced: bool  # whether a producer's announcement brought the due time forward


class Waiter:
    """Sleeps on the queues' wake channel until a target time less the claim lead."""

    def __init__(
        self,
        client: Any,
        channels: Sequence[str],
        clock: Clock,
        stopping: Callable[[], bool],
        stop_event: threading.Event,
    ) -> None:
        self.client = client
        self.channels = list(channels)
        self.clock = clock
        self.lead = ClaimLead()
        self._stopping = stopping
        self._stop_event = stop_event
        self._pubsub: Any = None

    @property
    def subscribed(self) -> bool:
        return self._pubsub is not None

    def wait(self, due_ms: int | None, poll_ms: int) -> Wake:
        """Sleep until one claim lead before ``due_ms`` or until ``poll_ms``, whichever is first.

        A producer that schedules a message due before ``due_ms`` announces its due time on
        the wake channel; the wait then aims at that. A poll (the idle safety poll, the
        maintenance round) is not a due time and is not woken for early.
        """
        lead = self.lead.ms
        announced_any = False
        known_since = exact_now_ms(self.clock)  # when the due time aimed at became known
        while not self._stopping():
            end_ms = poll_ms if due_ms is None else min(poll_ms, due_ms - lead)
            remaining = (end_ms - exact_now_ms(self.clock)) / 1000
            if remaining <= 0:
                break
            announced = self._listen(min(remaining, WAIT_SLICE_SECONDS))
            if announced is not None and (due_ms is None or announced < due_ms):
                due_ms, announced_any = announced, True
                known_since = exact_now_ms(self.clock)
        if due_ms is None or due_ms - lead > poll_ms:
            return Wake(None, poll_ms, announced_any)
        # A due time learnt less than one lead ahead could not be woken for earlier: the round
        # trip's cost counts from when it was learnt, or the lead would feed on itself.
        return Wake(due_ms, max(due_ms - lead, known_since), announced_any)

    def close(self) -> None:
        """Drop the pub/sub connection (after an outage, and when the consumer stops)."""
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None

    def _listen(self, timeout: float) -> int | None:
        try:
            with redis_errors("wake channel"):
                if self._pubsub is None:
                    self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                    self._pubsub.subscribe(*self.channels)
                message = self._pubsub.get_message(timeout=timeout)
        except Exception as e:  # an outage, or a pub/sub connection in a bad state
            logger.debug("wake channel unavailable: %s", e)
            self.close()
            self._stop_event.wait(timeout)
            return None
        if not message or message.get("type") != "message":
            return None
        try:
            return int(float(to_str(message["data"])))
        except ValueError:
            return self.clock.now_ms()


def sleep_until_due(clock: Clock, due_ms: int, longest_ms: float = MAX_CLAIM_LEAD_MS) -> None:
    """Hold a handler until ``due_ms`` on ``clock`` if that is at most ``longest_ms`` away.

    A claim is at most one claim lead early, so an early-claimed message always waits. One
    due further off was made ready ahead of its time on purpose ("run now" in the admin) and
    runs at once; a clock that does not move (tests) holds a thread ``longest_ms`` at most.
    """
    early_ms = due_ms - exact_now_ms(clock)
    if early_ms <= 0 or early_ms > longest_ms:
        return
    deadline = time.monotonic() + longest_ms / 1000
    while early_ms > 0 and time.monotonic() < deadline:
        time.sleep(early_ms / 1000)
        early_ms = due_ms - exact_now_ms(clock)
