"""Never early, every attempt: a retry, a requeued dead letter, a message run now or given back
starts no earlier than the instant it became due, on a handler thread or the event loop.

The consumer claims up to one claim lead (5 ms at most) before the time it aims at, and the
handler waits out the rest. For a retry the time aimed at is its retry time, while its
envelope's due time (its first delivery's) is long past: the wait must be for the retry time,
which the claim returns as the message's ``ready_since_ms``.

The ledger tests run a real consumer on a real Redis and compare each start, read on the
queue's clock, with the retry time the consumer itself sent in its nack (read from the nack
call, not from what the claim says): nothing there waits for a sleep to be long enough.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from core_consumer_support import T0
from waiting import wait_until

from django_delayqueue.core import ManualClock, Message, Queue, QueueSettings, Retry, SystemClock
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.waiter import Wake, became_due_ms
from django_delayqueue.core.scripts.calls import ScriptCall

MESSAGES = 24
SPACING_MS = 9  # between first due times: more than a claim lead, so each retry has its own aim
RETRY_DELAY = 0.12


class NackLedger(Queue):
    """A real queue that notes the retry time of every nack sent with it, from the call's
    own arguments (nack.lua's ARGV: now, max attempts, horizon, wake channel, then id, token,
    retry-at, reason per message)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_at: dict[tuple[str, int], int] = {}  # (id, the attempt it is due for)
        self._lock = threading.Lock()

    def nack_call(
        self, failures: Iterable[tuple[Message, float | None, str]], now_ms: int, bury: bool = False
    ) -> ScriptCall:
        failures = list(failures)
        call = super().nack_call(failures, now_ms, bury)
        with self._lock:
            for (m, _, _), at in zip(failures, call.args[6::4], strict=True):
                if int(at) >= 0:
                    self.retry_at[(m.id, m.attempt + 1)] = int(at)
        return call


class Starts:
    """Each delivery's attempt and start (the local wall clock: a SystemClock queue's clock);
    the first attempt asks to be retried."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[tuple[Message, float]] = []

    def note(self, message: Message) -> None:
        started = time.time() * 1000
        with self.lock:
            self.starts.append((message, started))
        if message.attempt == 1:
            raise Retry(RETRY_DELAY)

    def early(self, q: NackLedger) -> list[tuple[str, int, float]]:
        """(id, attempt, ms early) of every start before the instant it became due."""
        out = []
        for m, started in self.starts:
            due = m.due_ms if m.attempt == 1 else q.retry_at[(m.id, m.attempt)]
            if started < due:
                out.append((m.id, m.attempt, round(due - started, 3)))
        return out


def _ledger_queue(client: redis.Redis) -> NackLedger:
    return NackLedger(
        client, "never-early", settings=QueueSettings(max_attempts=3), clock=SystemClock()
    )


def _schedule(q: Queue) -> None:
    start = q.clock.now_ms() + 300
    q.schedule_many(
        [{"payload": i, "id": f"m{i}", "at": start + SPACING_MS * i} for i in range(MESSAGES)]
    )


def _run_to_the_end(consumer: Consumer, starts: Starts, running: Any) -> None:
    running(consumer)
    wait_until(lambda: len(starts.starts) == 2 * MESSAGES, timeout=60)
    wait_until(lambda: consumer.delivered == 2 * MESSAGES, timeout=60)


def test_a_retry_on_a_handler_thread_never_starts_before_its_retry_time(
    redis_client: redis.Redis, running: Any
) -> None:
    q = _ledger_queue(redis_client)
    _schedule(q)
    starts = Starts()
    consumer = Consumer([q], starts.note, idle_seconds=3600, maintenance_seconds=3600)
    _run_to_the_end(consumer, starts, running)
    assert len(q.retry_at) == MESSAGES  # every first attempt was retried, through the ledger
    assert starts.early(q) == []


def test_a_retry_on_the_event_loop_never_starts_before_its_retry_time(
    redis_client: redis.Redis, running: Any
) -> None:
    q = _ledger_queue(redis_client)
    _schedule(q)
    starts = Starts()

    async def handler(message: Message) -> None:
        starts.note(message)
        await asyncio.sleep(0)

    consumer = Consumer([q], handler, idle_seconds=3600, maintenance_seconds=3600)
    _run_to_the_end(consumer, starts, running)
    assert len(q.retry_at) == MESSAGES
    assert starts.early(q) == []


# --- what the claim says, on a controllable clock -------------------------------------------------


def _retry_due_in(q: Queue, clock: ManualClock, ms: int) -> int:
    """Schedule, claim and fail a message so that its retry is due ``ms`` from now (after the
    clock moved on to there); returns the retry time."""
    q.schedule("x", id="x")
    (m,) = q.claim()
    q.nack(m, delay=0.06)
    retry_at = clock.now_ms() + 60
    clock.set(retry_at - ms)
    return retry_at


def test_a_retry_claimed_one_claim_lead_early_is_held_until_its_retry_time(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    q = make_queue()
    retry_at = _retry_due_in(q, manual_clock, 3)
    consumer = Consumer([q], lambda m: None)
    # The wait ended one claim lead before the retry time: the round claims it then.
    consumer._plan.aim = Wake(due_ms=retry_at, planned_ms=retry_at - 3, announced=False)
    (m,) = consumer._plan.fetch()
    assert (m.attempt, m.due_ms, m.ready_since_ms) == (2, T0, retry_at)
    assert became_due_ms(m) == retry_at  # not its first due time, past


def test_a_retry_given_back_before_its_retry_time_keeps_it(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    """A consumer that stops in the milliseconds between claiming a retry early and its retry
    time gives it back: whoever claims it next must still hold it until its retry time, not
    take the release as the instant it became due."""
    q = make_queue()
    retry_at = _retry_due_in(q, manual_clock, 3)
    consumer = Consumer([q], lambda m: None)
    consumer._plan.aim = Wake(due_ms=retry_at, planned_ms=retry_at - 3, announced=False)
    (m,) = consumer._plan.fetch()
    assert q.release(m) == 1
    (again,) = q.claim()
    assert (again.attempt, again.ready_since_ms) == (2, retry_at)
    assert became_due_ms(again) == retry_at
    # Given back after its retry time, it is due from its release (see test_core_queue_overdue).
    manual_clock.advance(ms=10)
    assert q.release(again) == 1
    (third,) = q.claim()
    assert third.ready_since_ms == retry_at + 7
