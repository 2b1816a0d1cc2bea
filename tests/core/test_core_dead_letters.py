"""core.dead_letters: a queue's dead letters counted by reason, and the ids of one reason (what
the admin's "dead letters by reason" table and its "requeue all" of a group act on)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.dead_letters import MOST_READ, ids_with_reason, reasons_of
from django_delayqueue.core.sharding import ShardedQueue


def bury(q: Any, ids: list[str], reason: str) -> None:
    for i in ids:
        q.shard_for(i).schedule({"id": i}, id=i)
    for shard in q.shards:
        for m in shard.claim(1000):
            assert shard.bury(m, reason)


def test_dead_letters_are_counted_by_reason_largest_group_first(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    bury(q, ["a1", "a2", "a3"], "PartnerDown: 503 Service Unavailable")
    manual_clock.advance(ms=5000)
    bury(q, ["b1"], "422 from the partner")
    found = reasons_of(q)
    assert (found.total, found.read, found.partial) == (4, 4, False)
    assert [(g.reason, g.count) for g in found.groups] == [
        ("PartnerDown: 503 Service Unavailable", 3),
        ("422 from the partner", 1),
    ]
    assert found.groups[1].newest_ms == found.groups[0].newest_ms + 5000
    assert sorted(ids_with_reason(q, "PartnerDown: 503 Service Unavailable")) == ["a1", "a2", "a3"]
    assert ids_with_reason(q, "422 from the partner") == ["b1"]
    assert ids_with_reason(q, "no such reason") == []


def test_only_the_newest_are_read_and_the_counts_say_so(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    bury(q, ["old-1", "old-2"], "old reason")
    manual_clock.advance(ms=1000)
    bury(q, ["new-1", "new-2", "new-3"], "new reason")
    found = reasons_of(q, most=3)
    assert (found.total, found.read, found.partial) == (5, 3, True)
    assert [(g.reason, g.count) for g in found.groups] == [("new reason", 3)]
    assert ids_with_reason(q, "old reason", most=3) == []
    assert MOST_READ >= 1000
    with pytest.raises(ValueError, match="most must be at least 1"):
        reasons_of(q, most=0)


def test_a_dead_letter_without_a_reason_is_a_group_of_its_own(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    bury(q, ["quiet"], "")
    (group,) = reasons_of(q).groups
    assert (group.reason, group.count) == ("", 1)
    assert ids_with_reason(q, "") == ["quiet"]


def test_a_sharded_queue_adds_its_shards_up(
    redis_client: redis.Redis, manual_clock: ManualClock
) -> None:
    q = ShardedQueue(
        [Queue(redis_client, "sq", shard=i, clock=manual_clock, prefix="dq") for i in range(2)]
    )
    ids = [f"m{i}" for i in range(12)]
    bury(q, ids, "same")
    assert {s.counts()["garbage"] for s in q.shards} != {0}  # spread over both
    found = reasons_of(q)
    assert (found.total, [(g.reason, g.count) for g in found.groups]) == (12, [("same", 12)])
    assert sorted(ids_with_reason(q, "same")) == sorted(ids)
