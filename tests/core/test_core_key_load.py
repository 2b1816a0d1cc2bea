"""key_load (lua/includes/key_turns.lua): each flow key's messages ready plus in flight, kept
exact by the engine through every transition (schedule, claim, ack, retry, dead, cancel, purge,
requeue, release, replace, a killed consumer's reap), with more keys than any bounded read;
never negative, and a key leaves it at 0. Real Redis, the manual clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.inspection import counts_and_activity
from django_delayqueue.monitoring.busiest_keys import read_busiest

KEYS = 250  # more keys than the old bounded read (100 in turn + 100 waiting) looked at


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms", visibility_timeout=30, max_attempts=2)


def load(q: Queue) -> dict[str, int]:
    raw = q.client.zrange(q.keys.key_load, 0, -1, withscores=True)
    return {k.decode(): int(v) for k, v in raw}


def truth(q: Queue) -> dict[str, int]:
    """Each key's messages in its list plus in flight, counted from the messages themselves
    (flow_keys hash, the key's list, the unack zset), not from what key_load keeps."""
    keys = {k.decode(): v.decode() for k, v in q.client.hgetall(q.keys.flow_keys).items()}
    found: Counter[str] = Counter()
    for key in set(keys.values()):
        found[key] += q.client.llen(q.keys.key_list(key))
    for id in q.client.zrange(q.keys.unack, 0, -1):
        if id.decode() in keys:
            found[keys[id.decode()]] += 1
    return {k: n for k, n in found.items() if n}


def check(q: Queue) -> dict[str, int]:
    """key_load is exact, never 0 or below (a key at 0 is gone)."""
    assert load(q) == truth(q)
    assert q.client.zrangebyscore(q.keys.key_load, "-inf", 0) == []
    return load(q)


def test_schedules_claims_and_acks_over_many_keys_keep_it_exact(q: Queue) -> None:
    q.schedule_many(
        [{"payload": n, "key": f"k{n % KEYS:03}"} for n in range(3 * KEYS)]
        + [{"payload": "later", "key": "k000", "delay": 60}]  # pending: not ready, not counted
    )
    q.schedule("plain")
    assert check(q) == {f"k{k:03}": 3 for k in range(KEYS)}
    claimed = q.claim(KEYS + 50)
    check(q)  # claimed messages moved from ready to in flight: still counted
    assert q.ack(*claimed[: KEYS // 2]) == KEYS // 2
    check(q)
    q.ack(*claimed[KEYS // 2 :])
    while claimed := q.claim(200):
        q.ack(*claimed)
        check(q)
    assert check(q) == {}


def test_retries_dead_letters_purge_and_requeue_keep_it_exact(
    q: Queue, manual_clock: ManualClock
) -> None:
    for n in range(4):
        q.schedule(n, key="store-1")
    q.schedule("x", key="store-2")
    first = q.claim(2)
    assert check(q) == {"store-1": 4, "store-2": 1}
    assert [q.nack(m, delay=10) for m in first] == [1, 1]  # retries: pending again
    assert check(q) == {"store-1": 3}
    manual_clock.advance(11)
    q.promote()
    assert check(q) == {"store-1": 4, "store-2": 1}
    again = [m for m in q.claim(10) if m.key == "store-2"]
    assert [q.nack(m, delay=1) for m in again] == [2]  # no attempts left: dead
    assert check(q) == {"store-1": 4}
    assert q.requeue(again[0].id) == 1
    assert check(q) == {"store-1": 4, "store-2": 1}
    dead = [m for m in q.claim(10) if m.key == "store-2"]
    assert q.nack_many([(dead[0], None, "bad")], bury=True) == [2]  # straight to the dead
    assert q.nack(dead[0], delay=1) == 0  # stale: not counted twice
    assert check(q) == {"store-1": 4}
    assert q.purge(dead[0].id) == 1
    assert check(q) == {"store-1": 4}


def test_cancel_release_and_replace_keep_it_exact(q: Queue) -> None:
    q.schedule("a", key="k1", id="a")
    q.schedule("b", key="k1", id="b")
    q.schedule("c", key="k2", id="c", delay=30)
    assert check(q) == {"k1": 2}
    assert q.cancel("c") == 1  # pending: was not counted
    assert check(q) == {"k1": 2}
    q.schedule("b2", key="k2", id="b", replace=True)  # ready, now of k2
    assert check(q) == {"k1": 1, "k2": 1}
    taken = q.claim(2)
    assert q.release(*taken) == 2  # back to the head of their lists: still counted once
    assert check(q) == {"k1": 1, "k2": 1}
    assert q.cancel("a", "b") == 2
    assert check(q) == {}


def test_a_killed_consumers_deliveries_leave_it_when_reaped(
    q: Queue, manual_clock: ManualClock
) -> None:
    for n in range(3):
        q.schedule(n, key=f"k{n}")
    assert len(q.claim(3)) == 3  # then the consumer dies: no ack
    assert check(q) == {"k0": 1, "k1": 1, "k2": 1}
    manual_clock.advance(31)
    assert q.reap().retried == 3  # back to retry (pending): neither ready nor in flight
    assert check(q) == {}
    manual_clock.advance(3600)
    q.promote()
    assert check(q) == {"k0": 1, "k1": 1, "k2": 1}


def test_the_busiest_keys_are_exact_beyond_any_sample(q: Queue) -> None:
    q.schedule_many([{"payload": n, "key": f"k{n:03}"} for n in range(KEYS)])
    # The busiest key joins the rotation last: past the head of turns the old read sampled.
    q.schedule_many([{"payload": n, "key": "zz-last"} for n in range(7)])
    replies = counts_and_activity([q], 0, 10, 10, now_ms=q.clock.now_ms(), busiest_top=3)
    found = read_busiest(replies[0][4])
    assert found is not None
    top = found.keys[0]
    assert (top.key, top.ready, top.in_flight) == ("zz-last", 7, 0)
    assert (found.keys_ready, found.keys_with_messages) == (KEYS + 1, KEYS + 1)
