"""Flow limits with real consumers (threads): the rate and the in-flight cap hold across all of
them, consumers sleep until the next token or a freed slot (no poll loop), limits edited while
they run are followed, and slots held by a killed consumer come back with the visibility
timeout.

The rate is checked on what the limiter decides by: each claim's ``now`` (``claimed_ms``, the
consumers' reading of the shared clock), so the checks hold however slowly the machine runs
its handler threads. Waits are bounds against hangs, never timing checks.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from core_consumer_support import EMPTY, Recorder
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import ManualClock, Message, SystemClock
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.waiter import MAX_CLAIM_LEAD_MS


class Counting(Consumer):
    """A consumer that counts its rounds (a poll loop would make thousands)."""

    rounds = 0

    def step(self, now_ms: int | None = None) -> int:
        self.rounds += 1
        return super().step(now_ms)


def most_in_any_window(instants: list[int], window_ms: float) -> int:
    instants = sorted(instants)
    return max(
        sum(1 for t in instants[i:] if t < start + window_ms) for i, start in enumerate(instants)
    )


def test_two_consumers_share_one_rate_and_sleep_between_tokens(
    make_queue: Any, running: Any
) -> None:
    queues = [make_queue(clock=SystemClock(), rate_limit="25/s", concurrency=4) for _ in "ab"]
    queues[0].schedule_many([{"payload": i} for i in range(25)])
    recorder = Recorder()
    consumers = [Counting([q], recorder, idle_seconds=1) for q in queues]
    for c in consumers:
        running(c)
    wait_until(lambda: len(recorder.calls) == 25 and queues[0].counts() == EMPTY)
    claimed = [m.claimed_ms for m in recorder.calls]
    # One start per 40 ms whatever two consumers with eight threads could take: in any
    # window of W ms at most 1 + W / 40 claims (the burst of 1, then the rate). A consumer
    # claims one claim lead before the instant it aims at (waiter.py), the token's: its
    # claims may read up to MAX_CLAIM_LEAD_MS early.
    for window in (40, 200, 1000):
        assert most_in_any_window(claimed, window) <= 1 + (window + MAX_CLAIM_LEAD_MS) // 40
    assert max(claimed) - min(claimed) >= 24 * 40 - MAX_CLAIM_LEAD_MS
    # Each consumer woke about once a token (both aim at each), not in a loop.
    assert all(c.rounds < 150 for c in consumers), [c.rounds for c in consumers]
    throttled = queues[0].client.hget(queues[0].keys.limiter, "throttled")
    assert int(throttled or 0) >= 20  # counted, not "late"


def test_max_in_flight_holds_across_consumers_whatever_their_concurrency(
    make_queue: Any, running: Any
) -> None:
    queues = [make_queue(clock=SystemClock(), max_in_flight=2, concurrency=4) for _ in "abc"]
    queues[0].schedule_many([{"payload": i} for i in range(12)])
    running_now, most, seen_unack, done = [0], [0], [0], [0]
    lock, release = threading.Lock(), threading.Semaphore(0)

    def handler(m: Message) -> None:
        unack = queues[0].counts()["unack"]  # this one included: the cap is the queue's
        with lock:
            running_now[0] += 1
            most[0] = max(most[0], running_now[0])
            seen_unack[0] = max(seen_unack[0], unack)
        assert release.acquire(timeout=TIMEOUT)
        with lock:
            running_now[0] -= 1
            done[0] += 1

    for q in queues:
        running(Consumer([q], handler, idle_seconds=0.05))
    for finished in range(12):
        # Two run at a time (fewer at the end): a freed slot is taken again by some consumer.
        wait_until(lambda f=finished: done[0] == f and running_now[0] == min(2, 12 - f))
        release.release()
    wait_until(lambda: queues[0].counts() == EMPTY)
    assert (most[0], seen_unack[0]) == (2, 2)


def test_a_freed_slot_wakes_another_consumer_that_waits_on_the_cap(
    make_queue: Any, running: Any
) -> None:
    first = make_queue(clock=SystemClock(), max_in_flight=2, concurrency=2)
    second = make_queue(clock=SystemClock(), max_in_flight=2, concurrency=2)
    first.schedule_many([{"payload": i} for i in range(4)])
    gate = threading.Event()
    started: list[Any] = []

    def handler(m: Message) -> None:
        started.append(m.payload)
        if len(started) <= 2:
            assert gate.wait(TIMEOUT)

    # The first claims two and then no more (max_messages); the second waits on the cap.
    running(Consumer([first], handler, max_messages=2))
    wait_until(lambda: len(started) == 2)
    waiting = Consumer([second], handler, idle_seconds=3600, maintenance_seconds=3600)
    waiting.announce_within_ms = 3_600_000  # no poll: only the wake channel can end its sleep
    running(waiting)
    wait_until(lambda: second.client.hget(second.keys.limiter, "held") == b"in_flight")
    gate.set()  # the first's acks free both slots: slot_freed.lua wakes the second
    wait_until(lambda: first.counts() == EMPTY)
    assert sorted(started) == [0, 1, 2, 3]


def test_a_rate_edited_while_running_is_followed(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock(), rate_limit="1/h")
    q.schedule_many([{"payload": i} for i in range(5)])
    recorder = Recorder()
    running(Consumer([q], recorder, idle_seconds=0.05))
    wait_until(lambda: len(recorder.calls) == 1)
    assert q.counts()["ready"] == 4  # the next token is an hour away
    q.settings = q.settings.replace(rate_limit="100/s burst 10")  # staff raise it
    wait_until(lambda: q.counts() == EMPTY)
    q.schedule_many([{"payload": i} for i in range(5, 8)])
    q.settings = q.settings.replace(rate_limit=None)  # and remove it
    wait_until(lambda: q.counts() == EMPTY)
    assert len(recorder.calls) == 8


def test_slots_of_a_killed_consumer_come_back_with_the_visibility_timeout(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    # A consumer that claimed and died holds its slots until its messages' deadline: then
    # reap returns them to retry, and the cap lets the next claims take them.
    q = make_queue(max_in_flight=2, visibility_timeout=30, backoff_base=0, backoff_max=0)
    q.schedule_many([{"payload": i} for i in range(4)])
    dead = q.claim(10)  # the killed consumer's claim: never acked
    assert len(dead) == 2
    assert q.claim(10) == []  # the cap is full while they are in flight
    manual_clock.advance(seconds=31)
    reaped = q.reap()
    assert reaped.retried == 2
    q.promote()
    assert len(q.claim(10)) == 2  # the slots are back, never lost
    assert q.counts()["unack"] == 2


def test_a_sharded_queue_keeps_its_rate_across_shards_and_consumers(
    redis_client: Any, running: Any
) -> None:
    from django_delayqueue.core import Queue, QueueSettings
    from django_delayqueue.core.sharding import ShardedQueue

    settings = QueueSettings(rate_limit="20/s", max_in_flight=4, concurrency=4)

    def shards() -> list[Queue]:
        clock = SystemClock()
        return [
            Queue(redis_client, "sharded", settings=settings, clock=clock, shard=i, shards=2)
            for i in range(2)
        ]

    ShardedQueue(shards()).schedule_many([{"payload": i} for i in range(30)])
    recorder = Recorder()
    for _ in "ab":  # two consumers, each claiming from both shards
        running(Consumer(shards(), recorder, idle_seconds=1))
    wait_until(lambda: len(recorder.calls) == 30)
    claimed = [m.claimed_ms for m in recorder.calls]
    # Each shard 10/s (one every 100 ms, burst 1): the queue 20/s, a burst of 2 at most.
    for window in (100, 500, 1000):
        assert most_in_any_window(claimed, window) <= 2 + 2 * ((window + MAX_CLAIM_LEAD_MS) // 100)
    assert max(claimed) - min(claimed) >= 14 * 100 - MAX_CLAIM_LEAD_MS


def test_a_burst_run_drains_a_rate_limited_queue_at_its_rate(make_queue: Any) -> None:
    q = make_queue(clock=SystemClock(), rate_limit="40/s", concurrency=2)
    q.schedule_many([{"payload": i} for i in range(6)])
    recorder = Recorder()
    done = threading.Event()

    def run() -> None:
        Consumer([q], recorder, burst=True).run()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(TIMEOUT)  # it ends by itself, once every token was used
    assert len(recorder.calls) == 6 and q.counts() == EMPTY
    claimed = [m.claimed_ms for m in recorder.calls]
    assert max(claimed) - min(claimed) >= 5 * 25 - MAX_CLAIM_LEAD_MS


def test_key_concurrency_holds_across_consumers_and_keeps_each_keys_order(
    make_queue: Any, running: Any
) -> None:
    """Three consumers (four threads each), 50 keys of 4 messages, key_concurrency 1: never two
    messages of one key running at once (the ledger), each key's messages in their order, and
    every message delivered (slots freed by the acks wake the consumers waiting on them)."""
    queues = [make_queue(clock=SystemClock(), key_concurrency=1, concurrency=4) for _ in "abc"]
    for n in range(4):
        for k in range(50):
            queues[0].schedule({"n": n}, key=f"store-{k}")
    lock = threading.Lock()
    running_keys: set[str] = set()
    overlaps: list[str] = []
    order: dict[str, list[int]] = {}

    client, keys = queues[0].client, queues[0].keys

    def run(message: Message) -> None:
        assert message.key is not None
        # What Redis holds in flight now: of this key, only this message.
        in_flight = [i.decode() for i in client.zrange(keys.unack, 0, -1)]
        of_key = client.hmget(keys.flow_keys, in_flight) if in_flight else []
        same = [i for i, k in zip(in_flight, of_key, strict=True) if k == message.key.encode()]
        with lock:
            if same != [message.id]:
                overlaps.append(f"{message.key}: {same}")
            if message.key in running_keys:
                overlaps.append(message.key)
            running_keys.add(message.key)
            order.setdefault(message.key, []).append(message.payload["n"])
        with lock:
            running_keys.discard(message.key)

    recorder = Recorder(run)
    for q in queues:
        running(Counting([q], recorder, idle_seconds=1))
    wait_until(lambda: len(recorder.calls) == 200 and queues[0].counts() == EMPTY)
    assert overlaps == []
    assert order == {f"store-{k}": [0, 1, 2, 3] for k in range(50)}


def test_a_consumer_sleeps_until_a_keys_next_token(make_queue: Any, running: Any) -> None:
    """key_rate_limit "20/s": one key's six messages start 50 ms apart (read on the claims'
    instants), another key's message at once, and the consumer wakes about once a token."""
    q = make_queue(clock=SystemClock(), key_rate_limit="20/s", concurrency=4)
    for n in range(6):
        q.schedule({"n": n}, key="+33612345678")
    q.schedule({"other": 1}, key="+33699999999")
    recorder = Recorder()
    consumer = Counting([q], recorder, idle_seconds=1)
    running(consumer)
    wait_until(lambda: len(recorder.calls) == 7 and q.counts() == EMPTY)
    of_key = sorted(m.claimed_ms for m in recorder.calls if m.key == "+33612345678")
    gaps = [b - a for a, b in itertools.pairwise(of_key)]
    assert all(gap >= 50 - MAX_CLAIM_LEAD_MS for gap in gaps), gaps
    other = next(m for m in recorder.calls if m.key == "+33699999999")
    assert other.claimed_ms <= of_key[1]  # not behind the first key's wait
    assert consumer.rounds < 60, consumer.rounds  # woken per token, not a poll loop
