"""The consumer's waits: the claim lead, holding an early-claimed handler, the wake channel."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from core_consumer_support import EMPTY, Recorder, Running
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import ManualClock, Message, Queue, SystemClock
from django_delayqueue.core.clock import exact_now_ms
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.waiter import (
    CLAIM_LEAD_MARGIN_MS,
    FIRST_CLAIM_LEAD_MS,
    MAX_CLAIM_LEAD_MS,
    WRITE_SOON_GAP_SECONDS,
    WRITE_SOON_SECONDS,
    ClaimLead,
    Waiter,
    became_due_ms,
    sleep_until_due,
)

# --- the claim lead -------------------------------------------------------------------------------


def test_claim_lead_starts_from_a_guess_and_follows_the_slowest_recent_round() -> None:
    lead = ClaimLead(window=4)
    assert lead.ms == FIRST_CLAIM_LEAD_MS + CLAIM_LEAD_MARGIN_MS
    for cost in (0.2, 2.0, 0.3, 0.4):
        lead.observe(cost)
    assert lead.ms == 2.0 + CLAIM_LEAD_MARGIN_MS
    for cost in (0.3, 0.3, 0.3, 0.3):  # the slow round leaves the window
        lead.observe(cost)
    assert lead.ms == 0.3 + CLAIM_LEAD_MARGIN_MS


def test_claim_lead_is_capped() -> None:
    lead = ClaimLead()
    lead.observe(250.0)  # a stalled round must not make claims arrive a quarter second early
    assert lead.ms == MAX_CLAIM_LEAD_MS


# --- holding a handler until its due time ---------------------------------------------------------


def test_sleep_until_due_returns_at_the_due_time_not_before() -> None:
    clock = SystemClock()
    for ahead_ms in (0.5, 2.0, 4.0):
        due = int(exact_now_ms(clock) + ahead_ms) + 1
        sleep_until_due(clock, due)
        assert exact_now_ms(clock) >= due


def test_sleep_until_due_does_not_hold_a_message_made_ready_long_before_its_due_time() -> None:
    clock = SystemClock()
    due = clock.now_ms() + 60_000  # "run now" in the admin on a message due in a minute
    sleep_until_due(clock, due)
    assert clock.now_ms() < due


def test_sleep_until_due_gives_up_after_longest_ms_on_a_clock_that_does_not_move() -> None:
    clock = ManualClock()
    sleep_until_due(clock, clock.now_ms() + 3, longest_ms=5)  # returns: no hang
    assert clock.now_ms() == ManualClock().now_ms()


def _claimed(due_ms: int, attempt: int = 1, ready_since_ms: int | None = None) -> Message:
    return Message("m", "q", None, due_ms, due_ms, attempt, "1", ready_since_ms=ready_since_ms)


def test_a_claimed_message_became_due_when_it_came_back_to_ready_if_it_did() -> None:
    now = 1_700_000_000_000
    # A first attempt (claimed up to one claim lead early): its due time.
    assert became_due_ms(_claimed(now + 3)) == now + 3
    # A retry, claimed up to one claim lead before its retry time: its envelope's due time is
    # its first delivery's, long past; the claim returned the retry time.
    assert became_due_ms(_claimed(now - 60_000, 2, now + 4)) == now + 4
    # "Run now" (or a requeue) on a message due later: the moment it was put back in ready,
    # however close its due time (not held for it).
    assert became_due_ms(_claimed(now + 3, 1, now - 2)) == now - 2
    assert became_due_ms(_claimed(now + 60_000, 2, now + 2)) == now + 2  # then its retry


def test_a_retry_is_held_until_its_retry_time_not_its_first_due_time() -> None:
    clock = SystemClock()
    for ahead_ms in (0.5, 2.0, 4.0):
        retry_at = int(exact_now_ms(clock) + ahead_ms) + 1
        # As HandlerDelivery.deliver holds a claimed message: until it became due.
        sleep_until_due(clock, became_due_ms(_claimed(retry_at - 60_000, 2, retry_at)))
        assert exact_now_ms(clock) >= retry_at


# --- waiting on the wake channel ------------------------------------------------------------------


def make_waiter(client: redis.Redis, clock: Any, channel: str = "wake") -> Waiter:
    return Waiter([(client, [channel])], clock, lambda: False)


def test_wait_ends_one_claim_lead_before_a_due_time(redis_client: redis.Redis) -> None:
    clock = SystemClock()
    waiter = make_waiter(redis_client, clock)
    try:
        waiter.lead = ClaimLead(cap_ms=200)
        waiter.lead.observe(200)  # a lead far longer than any wake-up overshoot
        due = clock.now_ms() + 400
        wake = waiter.wait(due, poll_ms=due + 60_000)
        assert wake.due_ms == due and not wake.announced
        assert wake.planned_ms == due - waiter.lead.ms
        assert wake.planned_ms <= exact_now_ms(clock) < due  # woke early, by the lead
    finally:
        waiter.close()


def test_a_poll_is_not_woken_for_early(redis_client: redis.Redis) -> None:
    clock = SystemClock()
    waiter = make_waiter(redis_client, clock)
    try:
        poll = clock.now_ms() + 50
        wake = waiter.wait(None, poll_ms=poll)
        assert wake.due_ms is None and exact_now_ms(clock) >= poll
        # A due time after the poll: the wait ends at the poll, aiming at no due time.
        poll = clock.now_ms() + 50
        wake = waiter.wait(poll + 1_000, poll_ms=poll)
        assert wake.due_ms is None and exact_now_ms(clock) >= poll
    finally:
        waiter.close()


def test_an_announcement_moves_the_due_time_earlier(redis_client: redis.Redis) -> None:
    clock = SystemClock()
    waiter = make_waiter(redis_client, clock)
    hour = 3_600_000
    try:
        assert waiter.wait_subscribed(20.0)
        soon = clock.now_ms() + 50
        redis_client.publish("wake", str(soon))
        wake = waiter.wait(clock.now_ms() + hour, poll_ms=clock.now_ms() + hour)
        assert wake.announced and wake.due_ms == soon
    finally:
        waiter.close()
    assert not waiter.subscribed


def test_a_due_time_learnt_too_late_to_wake_early_is_not_counted_as_lead(
    redis_client: redis.Redis,
) -> None:
    clock = SystemClock()
    waiter = make_waiter(redis_client, clock)
    before = exact_now_ms(clock)
    wake = waiter.wait(clock.now_ms() - 10, poll_ms=clock.now_ms() + 1_000)  # already due
    # Measured from when it was known, not from a planned wake that lay in the past: else
    # every such round would count the lead itself as cost and push the lead up.
    assert wake.planned_ms >= before


def test_a_stop_ends_the_wait(redis_client: redis.Redis) -> None:
    stop = threading.Event()
    clock = SystemClock()
    waiter = Waiter([(redis_client, ["wake"])], clock, stop.is_set)
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    try:
        wake = waiter.wait(None, clock.now_ms() + 3_600_000)
    finally:
        waiter.close()
    assert not wake.announced
    assert time.monotonic() - started < 60  # not the hour it aimed at


# --- writes waiting for a round (a task's RUNNING) ----------------------------------------------


def test_a_write_soon_ends_a_wait_at_once_but_quick_ones_do_not_end_one_wait_each() -> None:
    """Lower bounds only: a wait never ends before the time written_soon() set."""
    waiter = Waiter([], SystemClock(), lambda: False)
    far = SystemClock().now_ms() + 3_600_000  # no due time, no poll for an hour
    start = time.monotonic()
    waiter.written_soon()
    assert waiter.wait(None, far).nudged  # within WRITE_SOON_SECONDS, not at the poll
    assert time.monotonic() - start >= WRITE_SOON_SECONDS
    waiter.written_soon()
    waiter.written_soon()  # rides on the round the first one asked for
    assert waiter.wait(None, far).nudged
    assert time.monotonic() - start >= WRITE_SOON_SECONDS + WRITE_SOON_GAP_SECONDS


def test_a_write_soon_riding_on_a_round_already_due_does_not_wait_for_the_lock() -> None:
    """A handler thread asks for every task it starts: when a round is already due by then,
    the answer needs no lock (the loop or a listener may hold it), and the round stays due."""
    waiter = Waiter([], SystemClock(), lambda: False)
    waiter.written_soon()  # a round due within WRITE_SOON_SECONDS
    due = waiter._remind_at
    answered = threading.Event()
    with waiter._cond:  # held, as by a wait in progress
        rider = threading.Thread(target=lambda: (waiter.written_soon(), answered.set()))
        rider.start()
        assert answered.wait(TIMEOUT)  # without the lock: it never gets it before this ends
    rider.join()
    assert waiter._remind_at == due  # the same round, neither moved nor dropped
    assert waiter.wait(None, SystemClock().now_ms() + 3_600_000).nudged


# --- a queue added while the consumer runs (a Tasks backend taking any queue: issue 24) ----------


class AddsQueues(Consumer):
    """Adds ``later`` at its first refresh, as the Django worker adds a registered task queue."""

    def __init__(self, queues: list[Queue], later: list[Queue], **kwargs: Any) -> None:
        super().__init__(queues, **kwargs)
        self.later = later
        self.added = threading.Event()  # set once the round that added them is over

    def refresh(self) -> None:
        if self.later:
            self.add_queues(self.later)
            self.later = []

    def step(self, now_ms: int | None = None) -> int:
        claimed = super().step(now_ms)
        self.added.set()
        return claimed


def test_a_queue_added_while_it_runs_is_woken_for_claimed_and_extended(make_queue: Any) -> None:
    """Nothing but its wake channel brings the new queue's message: no poll for an hour."""
    first = make_queue("first", clock=SystemClock())
    later = make_queue("later", clock=SystemClock(), visibility_timeout=1)
    release = threading.Event()
    handler = Recorder(lambda m: release.wait(TIMEOUT))
    consumer = AddsQueues(
        [first], [later], handler=handler, idle_seconds=3600, maintenance_seconds=3600
    )
    consumer.announce_within_ms = 3_600_000
    running = Running(consumer)
    try:
        assert consumer.added.wait(TIMEOUT)  # a message now is not seen by that round's promote
        later.schedule("slow", delay=0.05)  # announced on its wake channel, and only there
        wait_until(lambda: handler.calls)
        message_id = handler.calls[0].id
        deadline = later.client.zscore(later.keys.unack, message_id)
        # Its deadline is pushed out while the handler runs (a third of the visibility timeout).
        wait_until(lambda: later.client.zscore(later.keys.unack, message_id) > deadline)
        release.set()
        wait_until(lambda: later.counts() == EMPTY)
        assert [m.queue for m in handler.calls] == ["later"]
    finally:
        release.set()
        running.stop()
