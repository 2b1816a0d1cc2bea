"""Re-scheduling an id that is taken: reported without replace, replaced or succeeded with it.

Without ``replace`` a schedule of a taken id creates nothing and says which state holds the id.
With ``replace=True`` a waiting (pending, ready, retry) or dead (garbage) message is replaced at
once by a new one; an in-flight (unack) one gets the new message as its successor, which its ack
schedules (and which takes its place if it dies instead).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayqueue.core import STATES, Queue, ScheduleResult
from django_delayqueue.core.envelope import decode_envelope

T0 = 1_700_000_000_000
EMPTY = dict.fromkeys(STATES, 0)


def put_in_every_state(q: Queue) -> None:
    """One message per state, each id named after its state, each payload 'old'."""
    for state in ("ready", "unack", "retry", "garbage"):
        q.schedule("old", id=state)
    claimed = {m.id: m for m in q.claim(10)}
    q.release(claimed["ready"])
    q.nack(claimed["retry"], delay=60, reason="ValueError: later")
    q.bury(claimed["garbage"], "no handler")
    q.schedule("old", delay=30, id="pending")
    assert q.counts() == dict.fromkeys(STATES, 1)


def payload(q: Queue, message_id: str) -> Any:
    return decode_envelope(q.client.hget(q.keys.messages, message_id))[2]


def in_flight_with_a_successor(q: Any) -> Any:
    """Message "first" under id "x" claimed, and "next" booked to follow it (due in 30 s)."""
    q.schedule("first", id="x")
    (m,) = q.claim()
    q.schedule("next", delay=30, id="x", replace=True)
    return m


def where(q: Queue, message_id: str) -> list[str]:
    """Every state holding ``message_id`` (the ready list read without dead entries)."""
    found = [s for s in ("pending", "unack", "retry", "garbage") if _zscore(q, s, message_id)]
    ready = [m.id for m in q.peek("ready", 0, 1000).messages]
    return found + ["ready"] * ready.count(message_id)


def _zscore(q: Queue, state: str, message_id: str) -> float | None:
    return q.client.zscore(getattr(q.keys, state), message_id)


def commands_run(client: redis.Redis) -> set[str]:
    """Commands the server ran since CONFIG RESETSTAT (inside scripts too), less that one."""
    names = {name.removeprefix("cmdstat_") for name in client.info("commandstats")}
    return names - {"config|resetstat"}


# --- without replace: nothing created, the state named ------------------------------------------


@pytest.mark.parametrize("state", STATES)
def test_schedule_of_a_taken_id_creates_nothing_and_names_its_state(
    redis_client: redis.Redis, make_queue: Any, state: str
) -> None:
    q = make_queue()
    put_in_every_state(q)
    before = {key: redis_client.dump(key) for key in q.keys.all_keys()}
    result = q.schedule("new", delay=5, id=state)
    assert result == ScheduleResult(state, False, T0 + 5_000, state)
    assert not result.replaced and not result.successor
    assert {key: redis_client.dump(key) for key in q.keys.all_keys()} == before


def test_a_free_id_is_created_with_no_state(make_queue: Any) -> None:
    q = make_queue()
    result = q.schedule("new", id="free")
    assert (result.created, result.state, result.replaced) == (True, None, False)
    assert q.schedule("new", id="free2", replace=True) == ScheduleResult("free2", True, T0, None)


def test_the_hot_path_reads_nothing_more_for_a_new_id(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("warm", delay=5)  # loads the script
    redis_client.config_resetstat()
    q.schedule("new", delay=5, id="new")
    assert commands_run(redis_client) == {"evalsha", "hsetnx", "type", "zadd"}
    redis_client.config_resetstat()
    assert not q.schedule("again", delay=5, id="new").created
    assert "zscore" in commands_run(redis_client)  # the state is read only when the id is taken


def test_schedule_many_counts_already_present_and_replacements(make_queue: Any) -> None:
    q = make_queue()
    put_in_every_state(q)
    items = [{"payload": "new", "id": s} for s in (*STATES, "free")]
    result = q.schedule_many(items)
    assert (result.scheduled, result.already_present, result.replaced) == (1, 5, 0)
    result = q.schedule_many([{**i, "id": f"{i['id']}-2"} for i in items], replace=True)
    assert (result.scheduled, result.already_present, result.replaced) == (6, 0, 0)
    result = q.schedule_many(items, replace=True)
    assert (result.scheduled, result.already_present, result.replaced) == (0, 0, 6)


def test_schedule_many_takes_replace_per_item_and_keeps_the_order(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("old", delay=30, id="a")
    result = q.schedule_many(
        [
            {"payload": "first", "id": "a", "replace": True},
            {"payload": "ignored", "id": "a"},
            {"payload": "third", "id": "a", "replace": True, "delay": 5},
            {"payload": "new", "id": "b"},
        ],
        chunk_size=1,
    )
    assert (result.scheduled, result.already_present, result.replaced) == (1, 1, 2)
    assert payload(q, "a") == "third" and _zscore(q, "pending", "a") == T0 + 5_000


# --- replace a waiting or dead message ------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "ready", "retry", "garbage"])
@pytest.mark.parametrize("due", ["now", "later"])
def test_replace_of_a_waiting_or_dead_message_is_a_new_message(
    redis_client: redis.Redis, make_queue: Any, state: str, due: str
) -> None:
    q = make_queue()
    put_in_every_state(q)
    delay = 0 if due == "now" else 10
    result = q.schedule("new", delay=delay, id=state, replace=True)
    assert (result.created, result.state, result.replaced) == (True, state, True)
    assert where(q, state) == ["ready" if due == "now" else "pending"]
    assert payload(q, state) == "new"
    k = q.keys
    for h in (k.attempts, k.tokens, k.reasons, k.ready_since):
        assert not redis_client.hexists(h, state), h  # a fresh message: no history
    counts = dict.fromkeys(STATES, 1)
    counts[state] -= 1
    counts["ready" if due == "now" else "pending"] += 1
    assert q.counts() == counts
    if due == "later":
        assert _zscore(q, "pending", state) == T0 + 10_000


def test_a_ready_message_due_now_again_keeps_its_place(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    for i in range(3):
        q.schedule("old", id=f"m{i}")
    q.schedule("new", id="m1", replace=True)
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"m0", b"m1", b"m2"]
    assert [(m.id, m.payload) for m in q.claim(10)] == [("m0", "old"), ("m1", "new"), ("m2", "old")]


def test_a_ready_message_moved_to_pending_is_delivered_once_with_its_new_payload(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    for i in range(3):
        q.schedule("old", id=f"m{i}")
    q.schedule("new", delay=5, id="m1", replace=True)  # its ready entry stays, dead
    assert q.counts() == {**EMPTY, "ready": 2, "pending": 1}
    assert [m.id for m in q.claim(10)] == ["m0", "m2"]
    manual_clock.advance(5)
    q.promote()
    assert [(m.id, m.payload) for m in q.claim(10)] == [("m1", "new")]


def test_a_late_ack_of_the_replaced_delivery_does_not_touch_the_new_message(
    make_queue: Any,
) -> None:
    q = make_queue()
    q.schedule("old", id="x")
    (m,) = q.claim()
    q.nack(m, delay=60)
    q.schedule("new", delay=5, id="x", replace=True)
    assert q.ack(m) == 0
    assert where(q, "x") == ["pending"] and payload(q, "x") == "new"


def test_replace_wakes_consumers_for_a_message_due_soon(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("old", delay=60, id="x")
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(q.keys.wake_channel)
    try:
        assert pubsub.get_message(timeout=5) is None  # the subscribe confirmation
        q.schedule("new", delay=1, id="x", replace=True)
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == str(T0 + 1_000).encode()
    finally:
        pubsub.close()


# --- replace a message in flight: its successor ---------------------------------------------------


def test_a_handler_books_its_own_next_run_under_the_same_id(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule({"run": 1}, id="tick")
    (m,) = q.claim()
    result = q.schedule({"run": 2}, delay=60, id="tick", replace=True)
    assert (result.created, result.state, result.successor) == (True, "unack", True)
    assert q.counts() == {**EMPTY, "unack": 1}  # a successor is not a state of its own
    assert payload(q, "tick") == {"run": 1}  # the running delivery is untouched
    assert q.ack(m) == 1
    assert where(q, "tick") == ["pending"] and _zscore(q, "pending", "tick") == T0 + 60_000
    assert payload(q, "tick") == {"run": 2}
    assert not redis_client.exists(q.keys.successors)
    assert not redis_client.hexists(q.keys.attempts, "tick")


def test_a_successor_due_now_goes_to_ready_and_is_announced(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("first", id="x")
    (m,) = q.claim()
    q.schedule("second", id="x", replace=True)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(q.keys.wake_channel)
    try:
        assert pubsub.get_message(timeout=5) is None
        assert q.ack(m) == 1
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == str(T0).encode()
    finally:
        pubsub.close()
    assert [(c.id, c.payload, c.attempt) for c in q.claim()] == [("x", "second", 1)]


def test_a_later_replace_replaces_the_successor(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("first", id="x")
    (m,) = q.claim()
    q.schedule("second", delay=5, id="x", replace=True)
    q.schedule("third", delay=7, id="x", replace=True)
    assert not q.schedule("ignored", id="x").created
    q.ack(m)
    assert payload(q, "x") == "third" and _zscore(q, "pending", "x") == T0 + 7_000


def test_a_successor_waits_through_retries_for_the_final_ack(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=3)
    q.schedule("first", id="x")
    (m,) = q.claim()
    q.schedule("next", delay=100, id="x", replace=True)
    assert q.nack(m, delay=1) == 1
    assert where(q, "x") == ["retry"]
    manual_clock.advance(1)
    q.promote()
    (again,) = q.claim()
    assert (again.payload, again.attempt) == ("first", 2)
    q.ack(again)
    assert where(q, "x") == ["pending"] and payload(q, "x") == "next"


@pytest.mark.parametrize("how", ["bury", "last attempt", "reaped on the last attempt"])
def test_a_successor_takes_the_place_of_a_delivery_that_dies(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any, how: str
) -> None:
    q = make_queue(max_attempts=1, visibility_timeout=10)
    m = in_flight_with_a_successor(q)
    if how == "bury":
        assert q.bury(m, "poison")
    elif how == "last attempt":
        assert q.nack(m, delay=0, reason="boom") == 2
    else:
        manual_clock.advance(10)
        assert q.reap().buried == 1
    assert q.counts() == {**EMPTY, "pending": 1}
    assert payload(q, "x") == "next"
    for h in (q.keys.attempts, q.keys.tokens, q.keys.reasons, q.keys.successors):
        assert not redis_client.hexists(h, "x")
    assert q.ack(m) == 0  # a late ack of the dead delivery does not touch its successor
    assert where(q, "x") == ["pending"]


def test_a_late_ack_of_a_reaped_delivery_schedules_its_successor(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=3, visibility_timeout=10)
    m = in_flight_with_a_successor(q)
    manual_clock.advance(10)
    assert q.reap().retried == 1
    assert q.ack(m) == 1  # finished after all, before its redelivery
    assert where(q, "x") == ["pending"] and payload(q, "x") == "next"


def test_replace_of_a_waiting_message_drops_its_successor(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    m = in_flight_with_a_successor(q)
    q.nack(m, delay=60)  # retrying, its successor waiting for the final ack
    q.schedule("newest", delay=5, id="x", replace=True)
    assert not redis_client.exists(q.keys.successors)
    assert where(q, "x") == ["pending"] and payload(q, "x") == "newest"


# --- cancel and successors ------------------------------------------------------------------------


def test_cancel_of_an_id_in_flight_removes_its_successor(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    m = in_flight_with_a_successor(q)
    assert q.cancel("x") == 1
    assert q.cancel("x") == 0
    assert not redis_client.exists(q.keys.successors)
    ((_, fields),) = redis_client.xrange(q.keys.journal)
    assert b'"cancel"' in fields[b"o"] and fields[b"n"] == b"1"
    assert q.ack(m) == 1
    assert q.counts() == EMPTY and redis_client.hlen(q.keys.messages) == 0


def test_cancel_of_a_retrying_id_removes_it_and_its_successor(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    m = in_flight_with_a_successor(q)
    q.nack(m, delay=60)
    assert q.cancel("x") == 2  # two messages: the retrying one and its successor
    assert q.counts() == EMPTY and not redis_client.exists(q.keys.successors)


def test_purge_of_a_dead_id_removes_a_successor_left_with_it(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    # Only a bad attempt count buries a message without its successor taking its place.
    q = make_queue()
    m = in_flight_with_a_successor(q)
    q.release(m)
    redis_client.hset(q.keys.attempts, "x", "lots")
    assert q.claim() == []
    assert where(q, "x") == ["garbage"]
    assert q.purge("x") == 1
    assert not redis_client.exists(q.keys.successors)
