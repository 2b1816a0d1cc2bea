"""Queue.cancel decides from the message's state, in O(log n) per id: no scan of the ready list.

A ready message cancelled in the middle of the list leaves a dead entry there (counted in the
queue's ``cancelled`` hash): claim drops it, counts and peek skip it. These tests check that
nothing scans the list, and that the dead entries never deliver, hide or double a message.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayqueue.core import STATES
from django_delayqueue.core.keys import TOMBSTONE_TOTAL
from django_delayqueue.core.scripts.loader import read_lua

T0 = 1_700_000_000_000
EMPTY = dict.fromkeys(STATES, 0)


def raw_ready(client: redis.Redis, q: Any) -> list[str]:
    return [i.decode() for i in client.lrange(q.keys.ready, 0, -1)]


def claim_all(q: Any) -> list[str]:
    """Ids of every message claimable now, claimed in small batches, in order."""
    ids: list[str] = []
    while q.counts()["ready"] or q.client.llen(q.keys.ready):
        ids += [m.id for m in q.claim(3)]
    return ids


def commands_run(client: redis.Redis) -> set[str]:
    """Names of the commands the server ran since the last CONFIG RESETSTAT (scripts included)."""
    return {name.removeprefix("cmdstat_") for name in client.info("commandstats")}


# --- nothing scans the ready list -----------------------------------------------------------------


def test_cancel_of_an_absent_or_a_ready_id_does_not_scan_a_long_ready_list(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    total = 200_000
    for start in range(0, total, 50_000):
        q.schedule_many([{"payload": 0, "id": f"m{i}"} for i in range(start, start + 50_000)])
    q.schedule("later", delay=60, id="later")
    redis_client.config_resetstat()
    assert q.cancel("absent", "m100000", "later") == 2
    # Every command cancel ran is O(1) or O(log n): LREM, LPOS or LRANGE would scan the list.
    used = commands_run(redis_client)
    assert not used & {"lrem", "lpos", "lrange", "lset", "linsert"}, used
    assert {"zrem", "zscore", "hexists"} <= used  # the state was looked up, not searched for
    assert q.counts()["ready"] == total - 1
    assert redis_client.llen(q.keys.ready) == total  # the entry stays, dead


# --- a ready message cancelled in the middle ------------------------------------------------------


def test_a_cancelled_ready_message_is_never_delivered_and_not_counted(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    for i in range(5):
        q.schedule({"n": i}, id=f"m{i}")
    assert q.cancel("m2") == 1
    k = q.keys
    for h in (k.messages, k.attempts, k.tokens, k.reasons):
        assert not redis_client.hexists(h, "m2")
    assert q.counts() == {**EMPTY, "ready": 4}
    assert [m.id for m in q.peek("ready").messages] == ["m0", "m1", "m3", "m4"]
    assert q.peek("ready").total == 4
    assert q.cancel("m2") == 0  # once
    assert [m.id for m in q.claim(10)] == ["m0", "m1", "m3", "m4"]
    assert redis_client.llen(k.ready) == 0 and not redis_client.exists(k.cancelled)
    assert q.counts() == {**EMPTY, "unack": 4}


def test_a_cancelled_ready_message_is_journalled_like_any_cancel(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    for i in range(3):
        q.schedule({"n": i}, id=f"m{i}")
    assert q.cancel("m1") == 1
    ((_, fields),) = redis_client.xrange(q.keys.journal)
    assert fields[b"n"] == b"1" and b'"m1"' in fields[b"o"] and b'"cancel"' in fields[b"o"]


@pytest.mark.parametrize("end", ["m0", "m4"])
def test_a_message_at_either_end_of_the_ready_list_is_popped_not_marked(
    redis_client: redis.Redis, make_queue: Any, end: str
) -> None:
    q = make_queue()
    for i in range(5):
        q.schedule({"n": i}, id=f"m{i}")
    assert q.cancel(end) == 1
    assert end not in raw_ready(redis_client, q)
    assert not redis_client.exists(q.keys.cancelled)


@pytest.mark.parametrize("how", ["due now", "pending then promoted", "run now"])
def test_an_id_scheduled_again_behind_its_dead_entry_is_delivered_exactly_once(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any, how: str
) -> None:
    # (Requeue and release cannot meet a dead entry: an id is claimed only after its dead
    # entries, which the claim drops first.)
    q = make_queue()
    for i in range(3):
        q.schedule({"n": i}, id=f"m{i}")
    assert q.cancel("m1") == 1
    if how == "due now":
        assert q.schedule("again", id="m1").created
    else:
        assert q.schedule("again", delay=5, id="m1").created
        if how == "pending then promoted":
            manual_clock.advance(5)
            assert q.promote().moved == 1
        else:
            assert q.run_now("m1") == 1
    assert raw_ready(redis_client, q) == ["m0", "m1", "m2", "m1"]  # dead entry, live one
    assert q.counts()["ready"] == 3
    assert [m.id for m in q.peek("ready").messages] == ["m0", "m2", "m1"]
    delivered = q.claim(10)
    assert [(m.id, m.payload) for m in delivered] == [
        ("m0", {"n": 0}),
        ("m2", {"n": 2}),
        ("m1", "again"),
    ]
    assert q.claim(10) == [] and not redis_client.exists(q.keys.cancelled)


def test_an_id_cancelled_twice_in_ready_leaves_two_dead_entries(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    for i in range(3):
        q.schedule({"n": i}, id=f"m{i}")
    q.cancel("m1")
    q.schedule("again", id="m1")
    q.schedule("tail", id="tail")  # so that the live m1 is not at the end either
    assert q.cancel("m1") == 1
    assert redis_client.hget(q.keys.cancelled, "m1") == b"2"
    assert redis_client.hget(q.keys.cancelled, TOMBSTONE_TOTAL) == b"2"
    assert q.counts()["ready"] == 3
    assert [m.id for m in q.peek("ready").messages] == ["m0", "m2", "tail"]
    assert [m.id for m in q.claim(10)] == ["m0", "m2", "tail"]
    assert not redis_client.exists(q.keys.cancelled)


def test_peek_pages_skip_dead_entries_exactly(make_queue: Any) -> None:
    q = make_queue()
    for i in range(10):
        q.schedule({"n": i}, id=f"m{i}")
    assert q.cancel("m2", "m4", "m6") == 3
    first, second, third = (q.peek("ready", offset, 3) for offset in (0, 3, 6))
    assert [m.id for m in first.messages] == ["m0", "m1", "m3"]
    assert [m.id for m in second.messages] == ["m5", "m7", "m8"]
    assert [m.id for m in third.messages] == ["m9"]
    assert first.total == second.total == 7


def test_snapshot_reads_the_first_live_ready_message(make_queue: Any, manual_clock: Any) -> None:
    q = make_queue()
    q.schedule("a", id="a")
    manual_clock.advance(1)
    q.schedule("b", id="b")
    manual_clock.advance(1)
    q.schedule("c", id="c")
    q.cancel("b")
    assert [m.id for m in q.claim(1)] == ["a"]  # the dead b is now the head of the list
    manual_clock.advance(1)
    snap = q.snapshot()
    assert snap.counts == {**EMPTY, "ready": 1, "unack": 1}
    assert snap.oldest_overdue_ms == 1_000  # c's, not b's (2 s) nor none


def test_a_long_run_of_dead_entries_is_dropped_over_bounded_claims(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(1503)])
    q.cancel(*(f"m{i}" for i in range(1, 1502)))  # m0 and m1502 live, 1501 dead between them
    assert q.counts()["ready"] == 2
    assert [m.id for m in q.claim(1)] == ["m0"]
    claimed: list[str] = []
    for _ in range(3):  # at most 1000 dead entries dropped per claim
        claimed += [m.id for m in q.claim(5)]
    assert claimed == ["m1502"]
    assert redis_client.llen(q.keys.ready) == 0 and not redis_client.exists(q.keys.cancelled)


def test_release_and_ack_are_not_confused_by_dead_entries(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    for i in range(4):
        q.schedule({"n": i}, id=f"m{i}")
    q.cancel("m1")
    m0, m2 = q.claim(2)
    assert (m0.id, m2.id) == ("m0", "m2")
    assert q.release(m2) == 1  # back to the front
    assert [m.id for m in q.peek("ready").messages] == ["m2", "m3"]
    assert claim_all(q) == ["m2", "m3"]
    assert q.ack(m0) == 1


def test_the_total_field_is_spelled_once_for_python_and_lua() -> None:
    assert f"'{TOMBSTONE_TOTAL}'" in read_lua("includes/ready_list.lua")


def test_cancel_of_a_message_whose_old_envelope_holds_an_infinite_time_is_journalled(
    redis_client: Any, make_queue: Any
) -> None:
    # cjson cannot encode an infinity: the journal row was built after the deletes, so the
    # script failed with the message already gone and no row written.
    q = make_queue()
    q.schedule({}, delay=100, id="x")
    redis_client.hset(q.keys.messages, "x", '{"d":1e999,"s":0,"p":{}}')  # earlier JSON form
    assert q.cancel("x") == 1
    assert q.counts()["pending"] == 0
    assert redis_client.xlen(q.keys.journal) == 1
