"""The limit wait of each message (lua/includes/limit_waits.lua): what a flow limit truly held it
back, said by the claim, whichever consumer claims, so that it is taken off the start lateness
(core/timings/recorder.py) and no limit's wait reads as lateness.

Consumers are simulated step by step on the manual clock with the real scripts: each step
every consumer records what finished (ack, then slot_freed.lua as a round does), and claims
what its handler threads have room for, read by the consumer's own round-trip code; so every
figure below is exact, and no assertion depends on how fast the machine runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django_delayqueue.core import ManualClock, Message, Queue
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.journal import ACK
from django_delayqueue.core.scripts.contracts import SLOT_FREED

T0 = 1_700_000_000_000


@dataclass
class SimulatedConsumer:
    """A consumer with ``concurrency`` handler threads whose handlers take ``handler_ms``."""

    consumer: Consumer
    queue: Queue
    concurrency: int
    handler_ms: int
    running: list[tuple[int, Message]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    def step(self, now: int) -> None:
        done = [m for end, m in self.running if end <= now]
        if done:
            self.running = [(end, m) for end, m in self.running if end > now]
            self.queue.ack(*done)
            self.outcomes += [Outcome(m, ACK, now - self.handler_ms, now) for m in done]
            channel = self.queue.keys.wake_channel
            SLOT_FREED.call(self.queue.keys, wake_channel=channel, now_ms=now).run(
                self.queue.client
            )
        room = self.concurrency - len(self.running)
        if room <= 0:
            return
        raw = self.queue.claim_call(now, room).run(self.queue.client)
        plan = [(self.queue, "claim", 0)]
        claimed, _ = self.consumer._round_trip._read_queue_results(plan, [raw], now)
        self.running += [(now + self.handler_ms, m) for m in claimed]


def simulate(
    make_queue: Callable[..., Queue],
    consumers: int,
    concurrency: int,
    handler_ms: int,
    messages: int,
    step_ms: int = 10,
    key: str | None = None,
    **limits: object,
) -> list[tuple[Outcome, int]]:
    """``messages`` due at T0, delivered by ``consumers`` simulated consumers: each delivery
    with its limit wait as the consumer records it."""
    clock = ManualClock(T0)
    queues = [make_queue("sms", clock=clock, **limits) for _ in range(consumers)]
    items = [{"payload": i, "id": f"m{i:03}"} for i in range(messages)]
    queues[0].schedule_many([{**item, "key": key} for item in items] if key else items)
    queues[0].promote(T0)
    sims = [
        SimulatedConsumer(Consumer([q], lambda m: None), q, concurrency, handler_ms) for q in queues
    ]
    now = T0
    while sum(len(s.outcomes) for s in sims) < messages:
        for s in sims:
            s.step(now)
        now += step_ms
        clock.advance(ms=step_ms)  # the acks' clock (ack.lua frees a key's slot at its now)
        assert now < T0 + 3_600_000, "the simulation does not end"
    return [
        (o, s.consumer._unrecorded.timings.limit_wait(o.message)) for s in sims for o in s.outcomes
    ]


def lateness(o: Outcome, waited: int) -> int:
    """The start lateness the consumer records (core/timings/recorder.py)."""
    return o.started_ms - o.message.due_ms - waited


def test_a_caps_wait_is_limit_wait_for_consumers_that_refill_their_free_slots(
    make_queue: Callable[..., Queue],
) -> None:
    """The docs' SMS example: max_in_flight 10, three consumers of concurrency 8, 100 ms
    handlers, 200 messages due at one instant. Every message after the first ten waited on
    the cap, whichever consumer took it (each refills the slots it frees, and is never held
    itself): none is late, and the waits add up to the whole of the time they waited."""
    delivered = simulate(
        make_queue, consumers=3, concurrency=8, handler_ms=100, messages=200, max_in_flight=10
    )
    assert len(delivered) == 200
    late = [o.message.id for o, waited in delivered if lateness(o, waited) > 0]
    assert late == []
    assert sum(w for _, w in delivered) == sum(
        o.started_ms - o.message.due_ms for o, _ in delivered
    )
    # 20 rounds of 10 slots, 100 ms each: the last ten waited 1.9 s on the cap.
    assert max(w for _, w in delivered) == 1900


def test_a_rates_wait_is_limit_wait_for_consumers_of_concurrency_one(
    make_queue: Callable[..., Queue],
) -> None:
    """rate_limit 10/s, three consumers of concurrency 1 (room for 30/s): the one that takes
    each token was not held itself (it was busy until then), yet its message waited on the
    rate since T0."""
    delivered = simulate(
        make_queue, consumers=3, concurrency=1, handler_ms=100, messages=30, rate_limit="10/s"
    )
    assert [o.message.id for o, waited in delivered if lateness(o, waited) > 0] == []
    assert max(w for _, w in delivered) == 2900


def test_a_consumer_slower_than_the_rate_is_late_not_waiting_on_it(
    make_queue: Callable[..., Queue],
) -> None:
    """rate_limit 100/s (one token per 10 ms) but one consumer of concurrency 1 with 100 ms
    handlers: each token waited 90 ms for a claim. The rate held the queue only until each
    token's instant: a message's wait is the rate's share, the rest is lateness."""
    delivered = simulate(
        make_queue,
        consumers=1,
        concurrency=1,
        handler_ms=100,
        messages=20,
        step_ms=5,
        rate_limit="100/s",
    )
    by_id = {o.message.id: (o, waited) for o, waited in delivered}
    last, waited = by_id["m019"]
    assert last.started_ms - T0 == 1900  # one start per 100 ms: the consumer's pace
    # The rate held the backlog 10 ms of each 100 after the first claim: 190 ms in all.
    assert (waited, lateness(last, waited)) == (190, 1900 - 190)


def test_no_wait_is_counted_where_no_limit_held_the_queue(
    make_queue: Callable[..., Queue],
) -> None:
    """A cap never reached (20, and 2 consumers of 4): the limit holds nothing, so the
    backlog's wait is all lateness, none limit wait."""
    delivered = simulate(
        make_queue, consumers=2, concurrency=4, handler_ms=100, messages=40, max_in_flight=20
    )
    assert sum(w for _, w in delivered) == 0
    assert max(lateness(o, w) for o, w in delivered) == 400


def test_a_keys_slot_wait_is_limit_wait_and_its_turn_after_the_slot_frees_is_not(
    make_queue: Callable[..., Queue],
) -> None:
    """key_concurrency 1, one key with ten messages, two consumers of concurrency 2: each
    message waits for the one before it to end (the key's slot), whichever consumer ends it
    and whichever claims the next. Nothing is late; the last waited 0.9 s on its key."""
    delivered = simulate(
        make_queue,
        consumers=2,
        concurrency=2,
        handler_ms=100,
        messages=10,
        key="a",
        key_concurrency=1,
    )
    assert [o.message.id for o, waited in delivered if lateness(o, waited) > 0] == []
    assert max(w for _, w in delivered) == 900


def test_a_keys_rate_wait_leaves_out_what_the_consumer_was_late(
    make_queue: Callable[..., Queue],
) -> None:
    """key_rate_limit 100/s for a key whose one consumer (concurrency 1) takes 100 ms a
    message: the key's token was there 90 ms before each claim; the key's limit held each
    message only until its token (the first claim's next token, then none)."""
    delivered = simulate(
        make_queue,
        consumers=1,
        concurrency=1,
        handler_ms=100,
        messages=5,
        step_ms=5,
        key="a",
        key_rate_limit="100/s",
    )
    by_id = {o.message.id: (o, waited) for o, waited in delivered}
    last, waited = by_id["m004"]
    assert (last.started_ms - T0, waited) == (400, 40)
