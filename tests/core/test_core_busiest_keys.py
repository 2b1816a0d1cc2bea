"""busiest_keys.lua and its reader (monitoring/busiest_keys.py): the flow keys with the most
ready and in-flight messages, exact while every key fits the bounded read, a labelled sample
beyond it; a sharded queue's shards ranked together. Real Redis, the manual clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_delayqueue.core import Queue
from django_delayqueue.core.inspection import counts_and_activity
from django_delayqueue.monitoring.busiest_keys import (
    BusiestKeys,
    BusyKey,
    merge_busiest,
    read_busiest,
)


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms", visibility_timeout=30, key_concurrency=1)


def busiest(q: Queue, most_keys: int = 100, most_fields: int = 2000, top: int = 10) -> Any:
    replies = counts_and_activity(
        [q], 0, 10, 10, now_ms=q.clock.now_ms(), busiest=(most_keys, most_fields, top)
    )
    return read_busiest(replies[0][4])


def rows(found: BusiestKeys) -> list[tuple[str, int, int]]:
    return [(k.key, k.ready, k.in_flight) for k in found.keys]


def test_a_queue_without_keys_has_none(q: Queue) -> None:
    q.schedule("plain")
    assert busiest(q) == BusiestKeys([], 0, 0, True)


def test_the_busiest_keys_count_ready_and_in_flight_messages(q: Queue) -> None:
    for n in range(6):
        q.schedule(n, key="hot")
    for key in ("a", "b", "b", "c,d", "é€😀"):
        q.schedule(key, key=key)
    q.schedule("plain")
    claimed = q.claim(10)  # one per key (key_concurrency 1), and the plain one
    assert len(claimed) == 6
    found = busiest(q)
    assert rows(found) == [("hot", 5, 1), ("b", 1, 1), ("a", 0, 1), ("c,d", 0, 1), ("é€😀", 0, 1)]
    assert (found.keys_ready, found.keys_in_flight, found.exact) == (2, 5, True)
    q.ack(*claimed)
    assert rows(busiest(q)) == [("hot", 5, 0), ("b", 1, 0)]
    assert rows(busiest(q, top=1)) == [("hot", 5, 0)]


def test_beyond_the_bounded_read_the_top_is_a_sample_and_says_so(q: Queue) -> None:
    for k in range(30):
        for n in range(k % 3 + 1):
            q.schedule(n, key=f"k{k:02}")
    found = busiest(q, most_keys=5)
    assert (found.keys_ready, found.exact) == (30, False)
    assert len(found.keys) == 5  # the next 5 in turn (none waits for a token or a slot)
    assert "a sample, among 30 key(s)" in found.summary()
    assert busiest(q).exact and "of 30 key(s)" in busiest(q).summary()


def test_keys_in_flight_are_read_in_bounded_pages(q: Queue) -> None:
    q.schedule_many([{"payload": k, "key": f"k{k:03}"} for k in range(300)])
    # 300 keys in flight: 600 fields of key_state, past what Redis keeps as one small listpack
    # (512 entries by default, which one HSCAN returns whole).
    assert sum(len(q.claim(100)) for _ in range(3)) == 300
    found = busiest(q, most_fields=20)
    assert found.keys_in_flight is None and not found.exact
    assert 0 < len(found.keys) <= 10
    assert busiest(q).keys_in_flight == 300


def test_a_sharded_queue_ranks_its_shards_keys_together() -> None:
    one = BusiestKeys([BusyKey("a", 5, 1), BusyKey("b", 1, 0)], 2, 1, True)
    two = BusiestKeys([BusyKey("c", 3, 0)], 1, None, False)
    merged = merge_busiest([one, two])
    assert merged is not None
    assert [k.key for k in merged.keys] == ["a", "c", "b"]
    assert (merged.keys_ready, merged.keys_in_flight, merged.exact) == (3, None, False)
    assert merge_busiest([one, None]) is None
