"""busiest_keys.lua and its reader (monitoring/busiest_keys.py): the flow keys with the most
ready and in-flight messages, exact at any number of keys (read from key_load: see
test_core_key_load.py); a sharded queue's shards ranked together. Real Redis, the manual
clock."""

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


def busiest(q: Queue, top: int = 10) -> Any:
    replies = counts_and_activity([q], 0, 10, 10, now_ms=q.clock.now_ms(), busiest_top=top)
    return read_busiest(replies[0][4])


def rows(found: BusiestKeys) -> list[tuple[str, int, int]]:
    return [(k.key, k.ready, k.in_flight) for k in found.keys]


def test_a_queue_without_keys_has_none(q: Queue) -> None:
    q.schedule("plain")
    assert busiest(q) == BusiestKeys([], 0, 0)


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
    assert (found.keys_ready, found.keys_with_messages) == (2, 5)
    q.ack(*claimed)
    assert rows(busiest(q)) == [("hot", 5, 0), ("b", 1, 0)]
    assert rows(busiest(q, top=1)) == [("hot", 5, 0)]


def test_every_key_is_ranked_and_the_summary_says_among_how_many(q: Queue) -> None:
    for k in range(130):
        for n in range(k % 3 + 1):
            q.schedule(n, key=f"k{k:03}")
    found = busiest(q, top=5)
    assert (found.keys_ready, found.keys_with_messages) == (130, 130)
    assert [k.load for k in found.keys] == [3] * 5
    names = [k.key for k in found.keys]
    assert names == sorted(names)  # ties by name among those read
    assert "of 130 key(s) with messages, 130 with ready ones" in found.summary()


def test_keys_in_flight_only_are_ranked_too(q: Queue) -> None:
    q.schedule_many([{"payload": k, "key": f"k{k:03}"} for k in range(300)])
    q.schedule_many([{"payload": n, "key": "k299"} for n in range(2)])
    assert sum(len(q.claim(100)) for _ in range(3)) == 300
    found = busiest(q)
    assert (found.keys_ready, found.keys_with_messages) == (1, 300)
    assert (found.keys[0].key, found.keys[0].ready, found.keys[0].in_flight) == ("k299", 2, 1)
    assert len(found.keys) == 10


def test_a_sharded_queue_ranks_its_shards_keys_together() -> None:
    one = BusiestKeys([BusyKey("a", 5, 1), BusyKey("b", 1, 0)], 2, 2)
    two = BusiestKeys([BusyKey("c", 3, 0)], 1, 4)
    merged = merge_busiest([one, two])
    assert merged is not None
    assert [k.key for k in merged.keys] == ["a", "c", "b"]
    assert (merged.keys_ready, merged.keys_with_messages) == (3, 6)
    assert merge_busiest([one, None]) is None
