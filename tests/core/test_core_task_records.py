"""Writes of a task's result record (core/task_records.py, write_record.lua): what they cost Redis.

A worker writes each task's result with its ack, in the consumer's pipeline: the write's
arguments are packed in Python (one JSON argument for the fields, not one per field), and
the script runs a fixed handful of commands whatever the number of fields. Counted with
``INFO commandstats`` on the test's own redis-server (calls inside scripts included).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from django_delayqueue.core import Queue
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.task_records import record_fields

ENQUEUED = '{"task":"shop.tasks.send","args":["é",1]}'


def commands(client: redis.Redis, call: ScriptCall) -> dict[str, int]:
    """The commands Redis ran for ``call`` (its script loaded first), by name."""
    client.script_load(call.script.source)
    client.config_resetstat()
    call.run(client)
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }


def success(q: Queue, order: int = 3) -> ScriptCall:
    """A task's end as the worker writes it: the start and enqueued where absent, the status,
    its times and return value in order, its worker whatever the order."""
    return q.record_write_call(
        "t1",
        order=order,
        kept_seconds=60,
        absent=["started_at", 1_700_000_000_000, "enqueued", ENQUEUED],
        in_order=[
            *("status", "SUCCESSFUL", "last_attempted_at", 1_700_000_000_000),
            *("finished_at", 1_700_000_000_005, "return_value", "null"),
        ],
        always=["worker:1", "host-1"],
    )


def test_a_task_s_end_costs_five_commands_whatever_its_fields(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    q = make_queue()
    ran = commands(redis_client, success(q))
    # One read (order and the fields set where absent), the no-op write that lets it run when
    # Redis is full, one HSET of everything, the expiry: no TYPE, no command per field.
    assert ran == {"evalsha": 1, "hmget": 1, "hdel": 1, "hset": 1, "expire": 1}
    record = redis_client.hgetall(q.keys.task_result("t1"))
    assert record == {
        b"started_at": b"1700000000000",
        b"enqueued": ENQUEUED.encode(),
        b"status": b"SUCCESSFUL",
        b"last_attempted_at": b"1700000000000",
        b"finished_at": b"1700000000005",
        b"return_value": b"null",
        b"worker:1": b"host-1",
        b"order": b"3",
    }
    assert 0 < redis_client.ttl(q.keys.task_result("t1")) <= 60


def test_fields_already_there_are_kept_and_a_late_write_sets_only_what_is_not_ordered(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    q = make_queue()
    key = q.keys.task_result("t1")
    redis_client.hset(key, mapping={"enqueued": "kept", "started_at": "1", "order": "9"})
    assert success(q, order=3).run(redis_client) == 0  # a later write landed first
    record = redis_client.hgetall(key)
    assert record[b"enqueued"] == b"kept" and record[b"started_at"] == b"1"
    assert b"status" not in record and record[b"order"] == b"9"
    assert record[b"worker:1"] == b"host-1"  # set whatever the order
    assert redis_client.ttl(key) == -1  # the expiry goes with the status


def test_a_record_of_the_wrong_type_is_refused_changing_nothing(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    q = make_queue()
    key = q.keys.task_result("t1")
    redis_client.set(key, "not a hash")
    with pytest.raises(Exception, match=r"WRONGTYPE .* holds a string, not a hash"):
        success(q).run(redis_client)
    assert redis_client.get(key) == b"not a hash"


def test_the_fields_travel_as_one_json_argument_byte_for_byte() -> None:
    fields = record_fields(["a", 12], ["s", 'ü\n"x'], ["gone"], [b"worker:1", "h"])
    assert fields == '[["a","12"],["s","ü\\n\\"x"],["gone"],["worker:1","h"]]'
    with pytest.raises(TypeError, match="text or a whole number"):
        record_fields([], ["s", 1.5], [], [])


def test_non_ascii_text_is_stored_as_the_same_utf8_bytes(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    q = make_queue()
    text = "ünïcødé ✓ 😀"
    call = q.record_write_call("t1", order=1, in_order=["return_value", text])
    call.run(redis_client)
    assert redis_client.hget(q.keys.task_result("t1"), "return_value") == text.encode()
