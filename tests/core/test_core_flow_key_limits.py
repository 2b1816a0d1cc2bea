"""Flow keys in the claim: turns between keys (fairness), key_concurrency, key_rate_limit, and
their state kept bounded (lua/includes/key_turns.lua, key_claims.lua). Real Redis, the manual
clock."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, QueueSettings, RedisClock, SystemClock
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.sharding import ShardedQueue, key_shard


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms", visibility_timeout=30, backoff_base=0, backoff_max=0)


def limited(q: Queue, **limits: object) -> Queue:
    q.settings = q.settings.replace(**limits)
    return q


def claim_raw(q: Queue, count: int) -> tuple[list[str], int | None]:
    """The ids a claim took (keys in order) and its hold ("come back at"), if any."""
    raw = q.claim_call(q.clock.now_ms(), count).run(q.client)
    messages = q.claimed(raw, q.clock.now_ms())
    return [m.id for m in messages], q.claim_hold(raw)


def keys_of(messages: list) -> list[str | None]:
    return [m.key for m in messages]


def test_one_key_with_a_backlog_cannot_delay_the_single_messages_of_others(q: Queue) -> None:
    for n in range(500):
        q.schedule({"n": n}, key="hot")
    for k in range(100):
        q.schedule({"k": k}, key=f"store-{k}")
    first_round = q.claim(101)
    assert sorted(keys_of(first_round)) == sorted(["hot"] + [f"store-{k}" for k in range(100)])
    # The hot key is taken from once per turn, in its order.
    assert [m.payload for m in q.claim(5)] == [{"n": n} for n in range(1, 6)]


def test_turns_hold_across_small_claims_and_promoted_messages(
    q: Queue, manual_clock: ManualClock
) -> None:
    for n in range(300):
        q.schedule({"n": n}, delay=1, key="hot")
    for k in range(30):
        q.schedule({"k": k}, delay=1, key=f"store-{k}")
    manual_clock.advance(1)
    q.promote()
    seen: list[str | None] = []
    for _ in range(4):  # 4 claims of 10: 40 turns, each of the 31 keys once before any twice
        seen += keys_of(q.claim(10))
    first_31 = seen[:31]
    assert len(set(first_31)) == 31
    assert seen.count("hot") == 40 - 30


def test_unkeyed_messages_take_turns_as_one_more_key(q: Queue) -> None:
    for n in range(50):
        q.schedule({"n": n}, key="hot")
    for n in range(50):
        q.schedule({"plain": n})
    taken = keys_of(q.claim(10))
    assert taken.count(None) == 5 and taken.count("hot") == 5  # they alternate
    assert q.counts()["ready"] == 90


def test_key_concurrency_holds_a_keys_next_message_until_its_delivery_ends(q: Queue) -> None:
    limited(q, key_concurrency=1)
    a = [q.schedule({"n": n}, key="a").id for n in range(3)]
    b = [q.schedule({"n": n}, key="b").id for n in range(2)]
    plain = q.schedule("p").id
    taken, hold = claim_raw(q, 10)
    assert sorted(taken) == sorted([a[0], b[0], plain])
    assert hold == -1  # until a slot frees
    taken, hold = claim_raw(q, 10)
    assert (taken, hold) == ([], -1)
    # Acknowledge a's delivery: its next message may start, b's may not.
    assert _ack(q, a[0]) == 1
    taken, hold = claim_raw(q, 10)
    assert (taken, hold) == ([a[1]], -1)


def _ack(q: Queue, message_id: str) -> int:
    """Acknowledge ``message_id``'s current delivery, as its consumer would."""
    token = q.client.hget(q.keys.tokens, message_id)
    if token is None:
        return 0
    return q.ack(Message(message_id, q.name, None, 0, 0, 1, token.decode()))


def test_a_retry_a_death_and_a_release_free_the_keys_slot(q: Queue) -> None:
    limited(q, key_concurrency=1)
    for n in range(4):
        q.schedule({"n": n}, key="a")
    (m,) = q.claim(10)
    q.nack(m, delay=0, reason="boom")  # retried: the slot is free
    (m,) = q.claim(10)
    assert m.payload == {"n": 1}
    q.bury(m, "poison")  # dead: the slot is free
    (m,) = q.claim(10)
    assert m.payload == {"n": 2}
    q.release(m)  # given back unstarted: to the head of its key's list, the slot free
    (m,) = q.claim(10)
    assert m.payload == {"n": 2}


def test_a_killed_consumers_key_slot_comes_back_with_the_visibility_timeout(
    q: Queue, manual_clock: ManualClock
) -> None:
    limited(q, key_concurrency=1)
    first = q.schedule({"n": 0}, key="a").id
    second = q.schedule({"n": 1}, key="a").id
    assert [m.id for m in q.claim(10)] == [first]  # its consumer is then killed (-9)
    manual_clock.advance(29)
    assert q.claim(10) == []  # the slot is held while the deadline is ahead
    manual_clock.advance(ms=1001)
    reaped = q.reap()
    assert reaped.retried == 1
    assert [m.id for m in q.claim(10)] == [second]  # the slot came back, never lost
    # The dead delivery's late ack frees nothing more: the key keeps one in flight.
    assert _ack(q, first) == 1
    q.promote()
    assert q.claim(10) == []


def test_key_rate_limit_spaces_a_keys_messages_and_says_when_to_come_back(
    q: Queue, manual_clock: ManualClock
) -> None:
    limited(q, key_rate_limit="1/s")
    ids = [q.schedule({"n": n}, key="a").id for n in range(3)]
    other = q.schedule("b", key="b").id
    t0 = manual_clock.now_ms()
    taken, hold = claim_raw(q, 10)
    assert sorted(taken) == sorted([ids[0], other])
    assert hold == t0 + 1000
    manual_clock.advance(0.999)
    assert claim_raw(q, 10) == ([], t0 + 1000)
    manual_clock.advance(ms=1)
    assert claim_raw(q, 10)[0] == [ids[1]]
    manual_clock.advance(1)
    assert claim_raw(q, 10)[0] == [ids[2]]


def test_key_rate_limit_burst(q: Queue, manual_clock: ManualClock) -> None:
    limited(q, key_rate_limit="1/s burst 3")
    for n in range(5):
        q.schedule({"n": n}, key="a")
    assert [m.payload["n"] for m in q.claim(10)] == [0, 1, 2]
    manual_clock.advance(1)
    assert [m.payload["n"] for m in q.claim(10)] == [3]


def test_limits_edited_live_apply_to_the_next_claim(q: Queue) -> None:
    limited(q, key_concurrency=1)
    for n in range(4):
        q.schedule({"n": n}, key="a")
    assert len(q.claim(10)) == 1
    limited(q, key_concurrency=3)
    assert len(q.claim(10)) == 2
    limited(q, key_concurrency=None)
    assert len(q.claim(10)) == 1


def test_cancel_and_replace_of_a_keyed_ready_message(q: Queue) -> None:
    q.schedule("a1", id="a1", key="a")
    q.schedule("a2", id="a2", key="a")
    q.schedule("a3", id="a3", key="a")
    assert q.counts()["ready"] == 3
    assert q.cancel("a2") == 1
    q.schedule("a3 again", id="a3", key="b", replace=True)
    assert q.counts()["ready"] == 2
    assert {(m.id, m.key, m.payload) for m in q.claim(10)} == {
        ("a1", "a", "a1"),
        ("a3", "b", "a3 again"),
    }


def test_key_state_is_gone_once_a_key_has_nothing_left(
    q: Queue, manual_clock: ManualClock, redis_client: redis.Redis
) -> None:
    limited(q, key_concurrency=1, key_rate_limit="10/s")
    for k in range(20):
        q.schedule("x", key=f"k{k}")
    for _ in range(3):
        for m in q.claim(100):
            q.ack(m)
        manual_clock.advance(0.2)
    q.schedule("x", key="last")  # the end of a delivery forgets GCRA times that are past
    q.ack(*q.claim(1))
    state = {f.decode() for f in redis_client.hkeys(q.keys.key_state)}
    assert {f for f in state if not f.startswith(" ")} == set()
    assert redis_client.zcard(q.keys.key_turns) == 0
    assert redis_client.zcard(q.keys.key_waiting) == 0
    assert redis_client.zrange(q.keys.key_tats, 0, -1) == [b"last"]  # its time is ahead
    assert redis_client.keys(q.keys.key_lists + "*") == []


def test_a_sharded_queue_keeps_a_keys_limit_exact_on_its_shard(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    settings = QueueSettings(key_concurrency=1)
    sharded = ShardedQueue(
        [
            Queue(redis_client, "sms", shard=i, clock=manual_clock, settings=settings)
            for i in range(4)
        ]
    )
    for n in range(5):
        sharded.schedule({"n": n}, key="a")
    home = key_shard("a", 4)
    taken = [m for shard in sharded.shards for m in shard.claim(10)]
    assert [(m.payload, m.key) for m in taken] == [({"n": 0}, "a")]
    assert sharded.shards[home].counts()["ready"] == 4


def test_key_concurrency_over_three_consumers_and_fifty_keys(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    """Three consumers claim and acknowledge concurrently: never two messages of a key at once
    (the ledger), and each key's messages start in the order they were scheduled."""
    producer = make_queue("ledger", key_concurrency=1, clock=RedisClock(redis_client))
    for n in range(20):
        for k in range(50):
            producer.schedule({"n": n}, key=f"k{k}")
    lock = threading.Lock()
    running: dict[str, int] = {}
    started: dict[str, list[int]] = defaultdict(list)
    overlaps: list[str] = []

    def consumer() -> None:
        q = make_queue("ledger", key_concurrency=1, clock=RedisClock(redis_client))
        while True:
            messages = q.claim(7)
            if not messages:
                counts = q.counts()
                if counts["ready"] + counts["unack"] == 0:
                    return
            for m in messages:
                with lock:
                    if m.key in running:
                        overlaps.append(m.key)
                    running[m.key] = m.payload["n"]
                    started[m.key].append(m.payload["n"])
            for m in messages:
                with lock:
                    del running[m.key]
                q.ack(m)

    threads = [threading.Thread(target=consumer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert {k: v for k, v in started.items()} == {f"k{k}": list(range(20)) for k in range(50)}


def test_run_now_and_promote_put_keyed_messages_in_their_keys_list(
    q: Queue, manual_clock: ManualClock
) -> None:
    limited(q, key_concurrency=1)
    q.schedule("later", id="later", delay=60, key="a")
    q.schedule("soon", id="soon", delay=1, key="a")
    assert q.run_now("later") == 1
    manual_clock.advance(1)
    q.promote()
    assert q.counts()["ready"] == 2
    assert [m.id for m in q.claim(10)] == ["later"]  # one of key "a" at a time, in its order


# --- issue 37: the queue's limits do not hide the key's (what a claim says held it back) -------


def test_a_cap_not_reached_does_not_hide_a_keys_token(q: Queue, manual_clock: ManualClock) -> None:
    """max_in_flight 4, never reached, and key_rate_limit 2/s: a claim that took one message of
    the key was held back by the key's token (0.5 s on), not by the cap: nothing is in flight
    beyond that one, and a consumer waiting for a slot would sleep until another's end."""
    limited(q, max_in_flight=4, key_rate_limit="2/s")
    for n in range(6):
        q.schedule({"n": n}, key="a")
    t0 = manual_clock.now_ms()
    taken, hold = claim_raw(q, 10)
    assert (len(taken), hold) == (1, t0 + 500)
    assert q.client.hget(q.keys.limiter, "held") == b"key"
    manual_clock.advance(ms=500)
    taken_next, hold = claim_raw(q, 10)
    assert (len(taken_next), hold) == (1, t0 + 1000)


def test_a_rate_token_does_not_stand_in_for_a_keys_slot(
    q: Queue, manual_clock: ManualClock
) -> None:
    """rate_limit 100/s with key_concurrency 1: while every key with ready messages has its
    slot taken, the rate's next token (10 ms on) cannot start anything. The claim says "when a
    slot frees" (slot_freed.lua wakes the consumers: the limiter says 'key'), not the token:
    a consumer would poll Redis a hundred times a second for nothing."""
    limited(q, rate_limit="100/s burst 2", key_concurrency=1)
    for key in "ab":
        for n in range(3):
            q.schedule({"n": n}, key=key)
    manual_clock.advance(ms=100)  # two tokens: one for each key
    assert len(claim_raw(q, 2)[0]) == 2  # one of each key: both out of slots
    manual_clock.advance(ms=20)
    assert claim_raw(q, 10) == ([], -1)
    assert q.client.hget(q.keys.limiter, "held") == b"key"


def test_a_burst_consumer_drains_a_key_rate_under_a_cap_not_reached(
    make_queue: Callable[..., Queue],
) -> None:
    """runqueue --burst (and testing.deliver_due) waits for a key's next token as for the
    queue's: with max_in_flight 4 never reached it returned after the first of six."""
    from core_consumer_support import burst

    q = make_queue("sms", clock=SystemClock(), max_in_flight=4, key_rate_limit="50/s")
    for n in range(6):
        q.schedule({"n": n}, key="a")
    seen: list[int] = []
    burst([q], lambda m: seen.append(m.payload["n"]))
    assert seen == list(range(6))
