"""Sleeping until the next due time, and starting the claim early enough to be on time.

Two costs stand between a due time and the start of its handler: waking up (a ``select()``
timeout overshoots by a few tenths of a millisecond) and the promote + claim round trip. The
consumer therefore wakes one *claim lead* before the time it aims at, claims what is due by
that time, and the handler thread waits out the rest (:func:`sleep_until_due`): the handler
starts on time and never early, and the message waits those last milliseconds safe in the
unack set. The time aimed at is the instant the message became due: its due time, or for one
that came back to ready (a retry, above all) the instant it did (:func:`became_due_ms`). The
lead is the slowest recent wake-to-claimed cost plus a margin, never more than
``MAX_CLAIM_LEAD_MS``; a cancel in those last milliseconds finds the message already claimed,
as it would a moment after its due time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock, exact_now_ms
from django_delayqueue.core.envelope import Message, to_str

logger = logging.getLogger(__name__)

MAX_CLAIM_LEAD_MS = 5.0
# Covers what the measured cost leaves out: handing the batch to a handler thread.
CLAIM_LEAD_MARGIN_MS = 0.5
FIRST_CLAIM_LEAD_MS = 1.5  # until a round has been measured
# A message may reach ready up to one claim lead early on *another* consumer's clock, whose
# never-ahead estimate of the server's can read a few milliseconds apart from ours: such a
# message is held until its due time too. One made ready early on purpose ("run now") says so
# (the claim returns when it came back to ready: see became_due_ms) and runs at once; a due
# time further off than the lead plus this allowance is not waited for either way.
CLOCK_SKEW_ALLOWANCE_MS = 100.0
HOLD_AT_MOST_MS = MAX_CLAIM_LEAD_MS + CLOCK_SKEW_ALLOWANCE_MS
WAIT_SLICE_SECONDS = 0.25  # short slices keep signals responsive; they cost no Redis commands
# A write waiting for a round (a task's RUNNING) ends the wait this soon, but waits end for
# that at most once per gap: quick handlers starting one after another must not bring a round
# each (what is written with a round costs nothing more; rounds do).
WRITE_SOON_SECONDS = 0.005
WRITE_SOON_GAP_SECONDS = 0.02


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
    nudged: bool = False  # ended early by nudge(): a handler finished, or a resubscribe


class _Listener:
    """One pub/sub connection (per Redis client) on a thread of its own.

    It reconnects by itself after an outage; after a reconnect it nudges the waiter, because
    an announcement published while it was away is lost.
    """

    def __init__(self, waiter: Waiter, client: RedisClient, channels: Sequence[str]) -> None:
        self._waiter = waiter
        self.client = client
        self._channels = list(channels)
        self._added: list[str] = []  # by add(), for the thread to subscribe
        self._added_lock = threading.Lock()
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        self._pubsub: Any = None
        self._thread = threading.Thread(target=self._run, name="delayqueue-wake", daemon=True)
        self._thread.start()

    def add(self, channels: Sequence[str]) -> None:
        """Listen on ``channels`` too, from the thread's next wait slice (pub/sub connections
        are not thread-safe: the thread subscribes); it nudges the waiter once subscribed."""
        with self._added_lock:
            self._added.extend(channels)

    def _take_added(self) -> list[str]:
        with self._added_lock:
            added, self._added = self._added, []
        return added

    def stop(self) -> None:
        """Ask the thread to end, and cut its connection so it need not finish a wait slice."""
        self._stop.set()
        pubsub = self._pubsub
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.connection.disconnect()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        failures, connected_before = 0, False
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._pubsub = self.client.pubsub()
                self._channels += self._take_added()
                pubsub.subscribe(*self._channels)
                confirmed = 0
                while not self._stop.is_set():
                    added = self._take_added()
                    if added:  # confirmed below like a resubscribe: then a nudge
                        self._channels += added
                        pubsub.subscribe(*added)
                    message = pubsub.get_message(timeout=WAIT_SLICE_SECONDS)
                    if not message:
                        continue
                    if message.get("type") == "subscribe":
                        # redis-py may reconnect and subscribe again by itself: every full
                        # set of confirmations after the first is a resubscribe (and so is
                        # the set completed by channels added since: announcements on them
                        # before they were confirmed are lost).
                        confirmed += 1
                        if confirmed % len(self._channels) == 0:
                            self.subscribed.set()
                            failures = 0
                            if connected_before:  # announcements may have been missed
                                self._waiter.nudge()
                            connected_before = True
                    elif message.get("type") == "message":
                        data = message["data"]
                        if data in (b"abort", "abort"):  # abort.lua: not a due time
                            self._waiter.aborts_announced()
                        else:
                            self._waiter.announce(_announced_ms(data, self._waiter.clock))
            except Exception as e:  # an outage, or a pub/sub connection in a bad state
                if self._stop.is_set():  # stop() cut the connection: not an outage
                    break
                logger.debug("wake channel unavailable: %s", e)
                failures += 1
            finally:
                self.subscribed.clear()
                self._pubsub = None
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
            self._stop.wait(min(2.0, 0.05 * 2 ** min(failures, 6)))


def _announced_ms(data: Any, clock: Clock) -> int:
    try:
        return int(float(to_str(data)))
    except ValueError:
        return clock.now_ms()


class Waiter:
    """Sleeps until a target time less the claim lead, an announcement, or a nudge.

    Producers announce due times on the queues' wake channels (one pub/sub listener per Redis
    client); handler threads nudge when they finish, so their outcome is recorded and their
    thread given another message at once.
    """

    def __init__(
        self,
        subscriptions: Sequence[tuple[Any, Sequence[str]]],
        clock: Clock,
        stopping: Callable[[], bool],
    ) -> None:
        self.subscriptions = [(client, list(channels)) for client, channels in subscriptions]
        self.clock = clock
        self.lead = ClaimLead()
        self._stopping = stopping
        self._listeners: list[_Listener] = []
        self._cond = threading.Condition()
        self._announced: int | None = None  # earliest due time announced since the last wait
        self._nudged = False
        self._remind_at: float | None = None  # see remind()
        self._written_at = -WRITE_SOON_GAP_SECONDS  # see written_soon()
        self.on_abort: Callable[[], None] | None = None  # an abort announced (consumer/aborts)

    @property
    def subscribed(self) -> bool:
        return bool(self._listeners) and all(x.subscribed.is_set() for x in self._listeners)

    def start(self) -> None:
        """Subscribe (on threads of their own); :meth:`wait` starts them if not yet done."""
        if not self._listeners:
            self._listeners = [_Listener(self, c, chans) for c, chans in self.subscriptions]

    def wait_subscribed(self, timeout: float) -> bool:
        """Wait until every listener is subscribed (not past ``timeout``: Redis may be down)."""
        self.start()
        deadline = time.monotonic() + timeout
        for listener in self._listeners:
            left = deadline - time.monotonic()
            if left <= 0 or not listener.subscribed.wait(left):
                return False
        return True

    def add_channels(self, client: RedisClient, channels: Sequence[str]) -> None:
        """Listen on ``channels`` of ``client`` too (a queue added to a running consumer)."""
        known = next((chans for c, chans in self.subscriptions if c is client), None)
        if known is None:
            self.subscriptions.append((client, list(channels)))
        else:
            known.extend(channels)
        if not self._listeners:  # start() subscribes to all of them
            return
        listener = next((x for x in self._listeners if x.client is client), None)
        if listener is None:
            self._listeners.append(_Listener(self, client, channels))
        else:
            listener.add(channels)

    def announce(self, due_ms: int) -> None:
        with self._cond:
            if self._announced is None or due_ms < self._announced:
                self._announced = due_ms
            self._cond.notify_all()

    def aborts_announced(self) -> None:
        """abort.lua announced an abort on a wake channel: tell whoever reads them."""
        on_abort = self.on_abort
        if on_abort is not None:
            on_abort()

    def remind(self, at_monotonic: float) -> None:
        """End the current (or next) wait at ``at_monotonic`` at the latest, as a nudge."""
        with self._cond:
            if self._remind_at is None or at_monotonic < self._remind_at:
                self._remind_at = at_monotonic
            self._cond.notify_all()

    def written_soon(self) -> None:
        """A write waits for the next round: end the wait within WRITE_SOON_SECONDS, or ride
        on a round already due by then (at most one round per WRITE_SOON_GAP_SECONDS)."""
        # Answered without the lock when a round is already due by then, as it mostly is (a
        # handler thread asks for every task it starts): the same answer as below. Safe to
        # read unlocked: the write was queued before this read, a remind is only ever moved
        # earlier, and the wait that clears it ends and starts the round that sends the write.
        at = max(time.monotonic() + WRITE_SOON_SECONDS, self._written_at + WRITE_SOON_GAP_SECONDS)
        remind_at = self._remind_at
        if remind_at is not None and remind_at <= at:
            return
        with self._cond:
            at = max(
                time.monotonic() + WRITE_SOON_SECONDS, self._written_at + WRITE_SOON_GAP_SECONDS
            )
            if self._remind_at is not None and self._remind_at <= at:
                return
            self._written_at = self._remind_at = at
            self._cond.notify_all()

    def nudge(self, blocking: bool = True) -> None:
        """End the current (or next) wait now. Non-blocking from a signal handler."""
        if not self._cond.acquire(blocking=blocking):
            # Another thread holds the lock (a handler's nudge, an announcement): no notify
            # without it, but the flag alone ends a wait within one slice (see idle and wait).
            self._nudged = True
            return
        try:
            self._nudged = True
            self._cond.notify_all()
        finally:
            self._cond.release()

    def idle(self, timeout: float, until: Callable[[], bool] | None = None) -> None:
        """Wait up to ``timeout`` seconds for a nudge (a handler finished, a stop request), or,
        given ``until``, for ``until()`` alone (a backoff that a nudge must not cut short).

        In slices: a nudge from a signal handler that found the lock taken only sets its flag.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if until is not None:
                    if until():
                        return
                elif self._nudged:
                    self._nudged = False
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, WAIT_SLICE_SECONDS))

    def wait(self, due_ms: int | None, poll_ms: int) -> Wake:
        """Sleep until one claim lead before ``due_ms`` or until ``poll_ms``, whichever is first.

        A producer that schedules a message due before ``due_ms`` announces its due time on
        the wake channel; the wait then aims at that. A poll (the idle safety poll, the
        maintenance round) is not a due time and is not woken for early. A nudge ends the
        wait at once.
        """
        self.start()
        lead = self.lead.ms
        announced_any = False
        known_since = exact_now_ms(self.clock)  # when the due time aimed at became known
        with self._cond:
            while not self._stopping():
                if self._announced is not None:
                    if due_ms is None or self._announced < due_ms:
                        due_ms, announced_any = self._announced, True
                        known_since = exact_now_ms(self.clock)
                    self._announced = None
                reminded = self._remind_at is not None and time.monotonic() >= self._remind_at
                if self._nudged or reminded:
                    self._nudged, self._remind_at = False, None
                    return Wake(None, exact_now_ms(self.clock), announced_any, nudged=True)
                end_ms = poll_ms if due_ms is None else min(poll_ms, due_ms - lead)
                remaining = (end_ms - exact_now_ms(self.clock)) / 1000
                if remaining <= 0:
                    break
                if self._remind_at is not None:
                    remaining = min(remaining, max(0.0, self._remind_at - time.monotonic()))
                self._cond.wait(min(remaining, WAIT_SLICE_SECONDS))
        if due_ms is None or due_ms - lead > poll_ms:
            return Wake(None, poll_ms, announced_any)
        # A due time learnt less than one lead ahead could not be woken for earlier: the round
        # trip's cost counts from when it was learnt, or the lead would feed on itself.
        return Wake(due_ms, max(due_ms - lead, known_since), announced_any)

    def close(self) -> None:
        """Stop listening (when the consumer stops)."""
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.stop()
        deadline = time.monotonic() + 2 * WAIT_SLICE_SECONDS + 1
        for listener in listeners:
            listener.join(max(0.0, deadline - time.monotonic()))


def became_due_ms(message: Message) -> int:
    """The instant a claimed ``message`` became due, which its handler never starts before.

    For a message that came back to ready, the instant it did (``ready_since_ms``, which the
    claim returns): a retry's retry time, the moment a dead letter was requeued, a message was
    run now, or a retry given back by a stopping consumer was (its retry time if later). Its
    envelope keeps its first due time: long past for a retry, which the claim may take up to
    one claim lead before its retry time; ahead for one run now, which runs at once. Else (a
    first attempt, or a claim that did not say) the envelope's due time.
    """
    since = message.ready_since_ms
    return message.due_ms if since is None else since


def sleep_until_due(clock: Clock, due_ms: int, longest_ms: float = HOLD_AT_MOST_MS) -> None:
    """Hold a handler until ``due_ms`` on ``clock`` if that is at most ``longest_ms`` away.

    A claim is at most one claim lead early (on the clock of whichever consumer promoted it),
    so an early-claimed message always waits. One due further off was made ready ahead of its
    time on purpose ("run now" in the admin, when the claim did not say so) and runs at once;
    a clock that does not move (tests) holds a thread ``longest_ms`` at most.
    """
    early_ms = due_ms - exact_now_ms(clock)
    if early_ms <= 0 or early_ms > longest_ms:
        return
    deadline = time.monotonic() + longest_ms / 1000
    while early_ms > 0 and time.monotonic() < deadline:
        time.sleep(early_ms / 1000)
        early_ms = due_ms - exact_now_ms(clock)


async def asleep_until_due(clock: Clock, due_ms: int, longest_ms: float = HOLD_AT_MOST_MS) -> None:
    """:func:`sleep_until_due` for a coroutine: the same hold, awaited (the event loop runs
    the other coroutines meanwhile)."""
    early_ms = due_ms - exact_now_ms(clock)
    if early_ms <= 0 or early_ms > longest_ms:
        return
    deadline = time.monotonic() + longest_ms / 1000
    while early_ms > 0 and time.monotonic() < deadline:
        await asyncio.sleep(early_ms / 1000)
        early_ms = due_ms - exact_now_ms(clock)
