"""Flow control in the claim (core/flow_limits.py, lua/includes/flow_limits.lua): a queue's
rate_limit and max_in_flight, on a manual clock, claim by claim."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.core.consumer.rounds.waiter import MAX_CLAIM_LEAD_MS
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.flow_limits import (
    NO_SLOT_SHARE,
    RateLimit,
    claim_spec,
    in_flight_problem,
    parse_rate,
    rate_problem,
    shards_problem,
)
from django_delayqueue.core.scripts.calls import ScriptBatch
from django_delayqueue.core.sharding import ShardedQueue

T0 = 1_700_000_000_000


def fill(q: Queue, n: int) -> None:
    q.schedule_many([{"payload": i, "id": f"m{i:04}"} for i in range(n)])


def claim(q: Queue, count: int = 100) -> tuple[int, int | None]:
    """How many a claim at the clock's now took, and its hold (None: not held back)."""
    raw = q.claim_call(q.clock.now_ms(), count).run(q.client)
    return len(q.claimed(raw, q.clock.now_ms())), q.claim_hold(raw)


# --- the setting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20/s", RateLimit(20, 1000, 1)),
        ("1200/m", RateLimit(1200, 60_000, 1)),
        ("100/h", RateLimit(100, 3_600_000, 1)),
        ("20/s burst 5", RateLimit(20, 1000, 5)),
        (" 3 / second  burst 2 ", RateLimit(3, 1000, 2)),
        ("7/min", RateLimit(7, 60_000, 1)),
    ],
)
def test_a_rate_reads_as_a_count_per_period_with_a_burst(text: str, expected: RateLimit) -> None:
    assert parse_rate(text) == expected
    assert parse_rate(str(expected)) == expected  # what queuestats shows reads back


@pytest.mark.parametrize(
    "bad", ["20", "20/d", "0/s", "-1/s", "20/s burst 0", "20/s burst", "2.5/s", 20, "fast"]
)
def test_a_bad_rate_is_refused_saying_the_format(bad: Any) -> None:
    problem = rate_problem(bad)
    assert problem is not None and "rate_limit" in problem
    with pytest.raises(ConfigurationError):
        QueueSettings(rate_limit=bad)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_a_bad_in_flight_cap_is_refused(bad: Any) -> None:
    assert in_flight_problem(bad) is not None
    with pytest.raises(ConfigurationError, match="max_in_flight"):
        QueueSettings(max_in_flight=bad)


def test_a_sharded_queue_splits_its_limits_and_never_sums_above_them() -> None:
    assert claim_spec(None, None, None, 1) == ""
    assert claim_spec("10/s", None, None, 1) == "100 1 0"
    assert claim_spec(None, 4, None, 1) == "0 0 4"
    specs = [claim_spec("10/s burst 5", 10, shard, 3) for shard in range(3)]
    assert specs == ["300 2 4", "300 2 3", "300 1 3"]
    assert claim_spec("3/s", None, 0, 3) == "1000 1 0"  # each shard: 1/s, the sum 3/s
    assert shards_problem(None, 2, 3) is not None
    assert shards_problem("10/s burst 2", None, 3) is not None
    assert shards_problem("10/s", 3, 3) is None


def test_a_cap_smaller_than_the_shards_is_clamped_never_summed_above(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A value the checks refuse can still reach a consumer (published to Redis by hand): the
    shares then add up to the cap, the last shards get none (they claim nothing), with a
    warning; a burst share stays 1 (a bucket of 0 would never start anything)."""
    claim_spec.cache_clear()
    with caplog.at_level("WARNING", logger="django_delayqueue.core.flow_limits"):
        caps = [int(claim_spec(None, 2, shard, 4).split()[2]) for shard in range(4)]
    assert caps == [1, 1, NO_SLOT_SHARE, NO_SLOT_SHARE]
    assert sum(max(0, cap) for cap in caps) == 2
    assert len([r for r in caplog.records if "no slot" in r.getMessage()]) == 1
    bursts = [int(claim_spec("10/s burst 2", None, shard, 4).split()[1]) for shard in range(4)]
    assert bursts == [1, 1, 1, 1]


def test_a_sharded_queue_never_has_more_in_flight_than_a_cap_below_its_shards(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    settings = QueueSettings(max_in_flight=2)  # refused by the checks, published by hand
    shards = [
        Queue(redis_client, "sc", settings=settings, clock=manual_clock, shard=i, shards=4)
        for i in range(4)
    ]
    ShardedQueue(shards).schedule_many([{"payload": i} for i in range(40)])
    assert [claim(q) for q in shards] == [(1, -1), (1, -1), (0, -1), (0, -1)]
    assert sum(q.counts()["unack"] for q in shards) == 2  # the cap, never one per shard


# --- the rate ---------------------------------------------------------------------------------


def test_no_limit_costs_the_claim_nothing_it_writes(make_queue: Callable[..., Queue]) -> None:
    q = make_queue()
    fill(q, 3)
    raw = q.claim_call(q.clock.now_ms(), 2).run(q.client)
    assert len(raw) == 8 and q.claim_hold(raw) is None  # the reply as before: no extra
    assert not q.client.exists(q.keys.limiter)


def test_the_rate_spaces_starts_evenly_and_says_when_the_next_may_start(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="10/s")  # one every 100 ms
    fill(q, 10)
    assert claim(q) == (1, T0 + 100)
    assert claim(q) == (0, T0 + 100)  # no token: nothing taken, told when
    manual_clock.set(T0 + 99)
    assert claim(q) == (0, T0 + 100)
    manual_clock.set(T0 + 100)
    assert claim(q) == (1, T0 + 200)
    manual_clock.set(T0 + 450)  # a quiet time: burst 1 keeps no more than one token
    assert claim(q) == (1, T0 + 550)
    assert q.counts()["unack"] == 3


def test_a_burst_starts_that_many_at_once_then_the_rate(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="10/s burst 3")
    fill(q, 20)
    assert claim(q) == (3, T0 + 100)
    manual_clock.set(T0 + 100)
    assert claim(q) == (1, T0 + 200)
    manual_clock.set(T0 + 10_000)  # idle long: the bucket refills to the burst, no more
    assert claim(q) == (3, T0 + 10_100)


def test_a_claim_that_takes_all_that_is_ready_is_not_held_back(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="10/s burst 5")
    fill(q, 2)
    assert claim(q) == (2, None)
    assert q.client.hget(q.keys.limiter, "held") is None


def test_over_any_window_starts_never_exceed_burst_plus_rate(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="50/s burst 4")  # 20 ms apart
    fill(q, 400)
    starts: list[int] = []
    for step in range(0, 5000, 7):  # claims at irregular instants, more often than tokens
        manual_clock.set(T0 + step)
        taken, _ = claim(q, 10)
        starts += [T0 + step] * taken
    for first in range(len(starts)):
        for window in (20, 100, 1000):
            inside = sum(1 for s in starts[first:] if s < starts[first] + window)
            assert inside <= 4 + window // 20
    assert len(starts) == 4 + (5000 - 7) // 20  # and the full rate is used


def test_two_consumers_racing_for_the_last_token_get_one_between_them(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    settings = QueueSettings(rate_limit="10/s burst 2")
    queues = [Queue(redis_client, "q", settings=settings, clock=manual_clock) for _ in range(2)]
    fill(queues[0], 10)
    assert claim(queues[0], 1) == (1, None)  # one token left
    # Both claims in one pipeline (Redis runs them one after the other, as for two consumers
    # whose claims arrive together): exactly one gets the last token.
    batch = ScriptBatch()
    for q in queues:
        batch.add(q.claim_call(T0, 5))
    replies = batch.run(redis_client)
    taken = [len(r) // 4 for r in replies]
    assert sorted(taken) == [0, 1]
    assert [queues[0].claim_hold(r) for r in replies] == [T0 + 100, T0 + 100]


def test_many_threads_claiming_at_once_take_exactly_the_tokens(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    settings = QueueSettings(rate_limit="100/s burst 7")
    fill(Queue(redis_client, "q", settings=settings, clock=manual_clock), 100)
    total, lock, go = [0], threading.Lock(), threading.Barrier(8)

    def consumer() -> None:
        client = redis.Redis.from_url(
            f"redis://{redis_client.connection_pool.connection_kwargs['host']}:"
            f"{redis_client.connection_pool.connection_kwargs['port']}"
        )
        q = Queue(client, "q", settings=settings, clock=manual_clock)
        go.wait()
        for _ in range(5):
            taken, _ = claim(q, 3)
            with lock:
                total[0] += taken
        client.close()

    threads = [threading.Thread(target=consumer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert total[0] == 7  # the burst at one instant, however many consumers ask


def test_messages_claimed_while_held_back_are_counted_throttled(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="10/s")
    fill(q, 3)
    claim(q)  # the first starts at once: not throttled
    assert q.client.hget(q.keys.limiter, "held") == b"rate"
    assert q.client.hget(q.keys.limiter, "held_ms") == str(T0).encode()
    for n in (1, 2):
        manual_clock.set(T0 + 100 * n)
        claim(q)
    assert q.client.hget(q.keys.limiter, "throttled") == b"2"
    assert q.client.hget(q.keys.limiter, "held") is None  # nothing left waits on the limit


def test_a_rate_edited_while_messages_wait_rescales_what_is_owed(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="1/h")
    fill(q, 10)
    assert claim(q) == (1, T0 + 3_600_000)
    q.settings = q.settings.replace(rate_limit="10/s")  # an hour owed at 1/h: 100 ms at 10/s
    assert claim(q) == (0, T0 + 100)
    manual_clock.set(T0 + 100)
    assert claim(q) == (1, T0 + 200)
    q.settings = q.settings.replace(rate_limit="1/s")  # lowered: one interval owed, now 1 s
    assert claim(q) == (0, T0 + 1100)


# --- the in-flight cap -------------------------------------------------------------------------


def test_the_cap_takes_only_the_free_slots_and_an_ack_frees_one(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue(max_in_flight=3)
    fill(q, 10)
    raw = q.claim_call(T0, 10).run(q.client)
    messages = q.claimed(raw, T0)
    assert (len(messages), q.claim_hold(raw)) == (3, -1)  # -1: when one in flight ends
    assert claim(q) == (0, -1)
    assert q.client.hget(q.keys.limiter, "held") == b"in_flight"
    q.ack(messages[0])
    assert claim(q) == (1, -1)
    assert q.counts()["unack"] == 3


def test_a_slot_freed_wakes_consumers_only_while_claims_wait_on_the_cap(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    from django_delayqueue.core.scripts.contracts import SLOT_FREED

    q = make_queue(max_in_flight=1)
    call = SLOT_FREED.call(q.keys, wake_channel=q.keys.wake_channel, now_ms=T0)
    assert call.run(redis_client) == 0  # nobody waits
    fill(q, 2)
    claim(q)
    assert call.run(redis_client) == 1


def test_rate_and_cap_together_hold_by_the_tighter(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue(rate_limit="10/s burst 5", max_in_flight=2)
    fill(q, 10)
    assert claim(q) == (2, -1)
    q.client.delete(q.keys.unack)  # as if both ended (a test shortcut)
    assert claim(q) == (2, -1)
    q.client.delete(q.keys.unack)
    assert claim(q) == (1, T0 + 100)  # the burst is used up: the rate holds now


def test_a_claim_one_lead_ahead_is_granted_its_token_that_early(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    """What docs/flow-control.md says: a consumer claims at the instant it aims at, up to one
    claim lead ahead of the server's clock, so a token may be granted that much early."""
    q = make_queue(rate_limit="20/s")
    fill(q, 3)
    assert claim(q) == (1, T0 + 50)
    manual_clock.set(T0 + 45)  # the server's now; the loop claims at T0 + 50 (5 ms lead)
    early = T0 + 45 + int(MAX_CLAIM_LEAD_MS)
    raw = q.claim_call(early, 100).run(q.client)
    assert (len(q.claimed(raw, early)), q.claim_hold(raw)) == (1, T0 + 100)


def test_a_sharded_queue_keeps_its_shares_per_shard(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    settings = QueueSettings(rate_limit="10/s burst 2", max_in_flight=3)
    shards = [
        Queue(redis_client, "sh", settings=settings, clock=manual_clock, shard=i, shards=2)
        for i in range(2)
    ]
    sharded = ShardedQueue(shards)
    sharded.schedule_many([{"payload": i} for i in range(40)])
    taken = [claim(q)[0] for q in shards]
    assert taken == [1, 1]  # the burst of 2 split: one each
    holds = [claim(q)[1] for q in shards]
    # Shard 0: 5/s (the queue 10/s), a token in 200 ms; shard 1's share of the cap (1) is full.
    assert holds == [T0 + 200, -1]
    manual_clock.set(T0 + 400)  # a token each; the cap of 3 is split 2 + 1
    assert [claim(q) for q in shards] == [(1, -1), (0, -1)]  # then both caps are full
    assert sum(q.counts()["unack"] for q in shards) == 3  # the queue's cap, never more
