"""The task results of a round as one write_records.lua call: its one argument and its reply of
one character per record (django_delayqueue.core.consumer.rounds.merged_writes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import redis

from django_delayqueue.core.consumer.outcomes import WritesWithAck
from django_delayqueue.core.consumer.rounds.merged_writes import merged_writes, record_replies


def entry(call: Any) -> Any:
    return SimpleNamespace(outcome=SimpleNamespace(writes=WritesWithAck(call)))


def write(q: Any, message_id: str, order: int, status: str = "SUCCESSFUL") -> Any:
    return q.record_write_call(
        message_id, order=order, in_order=["status", status], required="enqueued",
        mergeable=True,
    )  # fmt: skip


def test_each_record_gets_its_own_reply_from_one_argument(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """Written in order (1), after a later write (0), record gone (-1), key of the wrong type
    (its error): each write's reply in its place, from one call of one argument."""
    q = make_queue()
    for mid in ("in_order", "late"):
        redis_client.hset(q.keys.task_result(mid), mapping={"enqueued": "{}", "order": 5})
    redis_client.set(q.keys.task_result("wrong_type"), "not a hash")
    entries = [
        entry(write(q, "in_order", 7)),
        entry(write(q, "late", 3)),
        entry(write(q, "gone", 7)),
        entry(write(q, "wrong_type", 7)),
        entry(write(q, "in_order_too", 7)),
    ]
    redis_client.hset(q.keys.task_result("in_order_too"), "enqueued", "{}")
    [(call, carried)] = merged_writes(entries)
    assert carried == entries and len(call.keys) == 5 and len(call.args) == 1
    reply = call.run(redis_client)
    assert reply[0] == b"10-e1"
    replies = record_replies(reply, 5)
    assert replies[:3] == [1, 0, -1] and replies[4] == 1
    assert isinstance(replies[3], redis.exceptions.ResponseError)
    assert "WRONGTYPE" in str(replies[3])
    assert redis_client.hget(q.keys.task_result("in_order"), "status") == b"SUCCESSFUL"
    assert redis_client.hget(q.keys.task_result("late"), "status") is None  # order 5 kept
    assert not redis_client.exists(q.keys.task_result("gone"))


def test_a_call_that_failed_whole_is_each_writes_error() -> None:
    error = redis.exceptions.ConnectionError("down")
    assert record_replies(error, 3) == [error, error, error]
    assert record_replies([b"11"], 3) == [[b"11"]] * 3  # not one code per write: not trusted


def test_a_value_with_a_newline_merges_escaped_and_a_raw_newline_goes_alone(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """Values are JSON-escaped (a newline in one never splits the call's lines); a write that
    holds a raw newline all the same (not one the Tasks backend makes) goes as its own call."""
    from django_delayqueue.core.scripts.calls import ScriptCall

    q = make_queue()
    odd = q.record_write_call(
        "odd", order=3, in_order=["status", "SUCCESSFUL"], always=["note", "two\nlines"],
        mergeable=True,
    )  # fmt: skip
    [(call, _)] = merged_writes([entry(write(q, "plain", 3)), entry(odd)])
    assert record_replies(call.run(redis_client), 2) == [-1, 1]  # "plain" has no record
    assert redis_client.hget(q.keys.task_result("odd"), "note") == b"two\nlines"
    raw = ScriptCall(odd.script, odd.keys, [odd.args[0].replace("\\n", "\n")])
    calls = merged_writes([entry(write(q, "a", 3)), entry(raw), entry(write(q, "b", 3))])
    assert [len(c.keys) for c, _ in calls] == [2, 1] and calls[1][0] is raw


def test_a_write_with_a_raw_newline_that_goes_alone_is_written(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """merged_writes sends a write holding a raw newline as its own call, "as the one line of
    its call": that call must write it (not split it at the newline and fail)."""
    from django_delayqueue.core.scripts.calls import ScriptCall

    q = make_queue()
    odd = q.record_write_call(
        "odd", order=3, in_order=["status", "SUCCESSFUL"], always=["note", "two\nlines"],
        mergeable=True,
    )  # fmt: skip
    raw = ScriptCall(odd.script, odd.keys, [odd.args[0].replace("\\n", "\n")])
    [_, (alone, _)] = merged_writes([entry(write(q, "a", 3)), entry(raw)])
    assert record_replies(alone.run(redis_client), 1) == [1]
    assert redis_client.hget(q.keys.task_result("odd"), "note") == b"two\nlines"


def test_a_round_s_records_cost_one_no_op_write_between_them(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """The write that lets a script run on a full server (an HDEL of a field no record holds)
    goes before the call's first write only: after it Redis lets the script finish, so each
    further record costs its read, its HSET and its expiry, not a fourth command."""
    q = make_queue()
    ids = [f"t{n}" for n in range(4)]
    for mid in ids:
        redis_client.hset(q.keys.task_result(mid), "enqueued", "{}")
    [(call, _)] = merged_writes([entry(write(q, mid, 3)) for mid in ids])
    redis_client.script_load(call.script.source)
    redis_client.config_resetstat()
    assert call.run(redis_client)[0] == b"1111"
    ran = {
        k.removeprefix("cmdstat_"): int(v["calls"])
        for k, v in redis_client.info("commandstats").items()
    }
    assert ran["hdel"] == 1 and ran["hmget"] == 4 and ran["hset"] == 4
    for mid in ids:
        assert redis_client.hget(q.keys.task_result(mid), "status") == b"SUCCESSFUL"
