"""A task's result record through requeues, reaps and late writes (django_delayqueue.tasks).

What ``get_result`` says of a task whose message went round again (requeued from the dead
letters, reaped, given back at a shutdown), what ``write_record.lua`` keeps when writes of two
deliveries land out of order, and the record's expiry: a record expires only once its task
ended, never while it may still run. Against the session's real Redis, on the demo's task
queue (the fixture of test_tasks_backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis
import test_tasks_backend as backend_tests
from test_tasks_backend import KEYS, QUEUE, burst, tasks_on_the_demo_queue  # noqa: F401

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.errors import CorruptEnvelope
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import WRITE_RECORD
from django_delayqueue.core.task_records import record_fields
from django_delayqueue.tasks import framework, runner
from django_delayqueue.tasks.payload import FAILED, RUNNING, SUCCESSFUL, TaskRecord

Status = framework.TaskResultStatus


def examples() -> Any:
    return backend_tests.examples  # tests/support/task_examples.py, once the fixture imported it


def write_record(
    client: redis.Redis,
    key: str,
    *,
    ttl: int,
    order: int,
    ordered: Sequence[Any],
    deleted: Sequence[str] = (),
    plain: Sequence[Any] = (),
) -> int:
    """write_record.lua called as its header says (no pairs set only where absent)."""
    call = WRITE_RECORD.call(
        record=key,
        kept_seconds=ttl,
        order=order,
        fields=record_fields((), ordered, deleted, plain),
    )
    return call.run(client)


# --- write_record.lua -----------------------------------------------------------------------


def test_a_late_write_of_an_older_delivery_leaves_the_latest_status_end_and_expiry(
    make_queue: Any, redis_client: redis.Redis
) -> None:
    q = make_queue()
    key = q.keys.task_result("t")
    redis_client.hset(key, mapping={"enqueued": "{}", "status": "READY"})
    # Delivery 7 runs (order 14); delivery 5, reaped earlier, finishes late (order 11).
    assert write_record(q.client, key, ttl=0, order=14, ordered=["status", RUNNING]) == 1
    late = ["status", SUCCESSFUL, "finished_at", 123, "return_value", "42"]
    assert write_record(q.client, key, ttl=60, order=11, ordered=late, plain=["worker:5", "A"]) == 0
    stored = redis_client.hgetall(key)
    assert stored[b"status"] == RUNNING.encode()
    assert b"finished_at" not in stored and b"return_value" not in stored
    assert redis_client.ttl(key) == -1  # no clock started while delivery 7 runs
    assert stored[b"worker:5"] == b"A"  # what happened in delivery 5 is still recorded


def test_a_write_in_order_that_is_not_an_end_takes_back_the_last_end(
    make_queue: Any, redis_client: redis.Redis
) -> None:
    q = make_queue()
    key = q.keys.task_result("t")
    ended = {"enqueued": "{}", "status": FAILED, "order": 11, "finished_at": 5, "return_value": 1}
    redis_client.hset(key, mapping=ended)
    redis_client.expire(key, 60)
    running = ["status", RUNNING]
    deleted = ["finished_at", "return_value"]
    assert write_record(q.client, key, ttl=0, order=14, ordered=running, deleted=deleted) == 1
    stored = redis_client.hgetall(key)
    assert stored[b"status"] == RUNNING.encode() and stored[b"order"] == b"14"
    assert b"finished_at" not in stored and b"return_value" not in stored
    assert redis_client.ttl(key) == -1


@pytest.mark.django_db(transaction=True)
def test_the_late_success_of_a_reaped_delivery_leaves_the_running_one(
    redis_client: redis.Redis,
) -> None:
    """At-least-once: a delivery whose consumer stalled past its deadline ends after the
    delivery that replaced it started; the record follows the later one."""
    result = examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (stalled,) = q.claim(1)
    later = stalled.claimed_ms + 10**9  # past its deadline, and past the retry's backoff
    assert q.reap(now_ms=later).retried == 1
    q.promote(now_ms=later)
    (again,) = q.claim(1, now_ms=later)
    first = runner._Attempt("w1", stalled, q, "{}")
    second = runner._Attempt("w2", again, q, "{}")
    second.write(RUNNING).run(q.client)
    late = first.write(SUCCESSFUL, returned="3", ttl=60, finished_at=q.clock.now_ms())
    late.run(q.client)
    key = KEYS.task_result(result.id)
    assert redis_client.ttl(key) == -1
    stored = examples().add.get_result(result.id)
    assert stored.status == Status.RUNNING and stored.finished_at is None
    assert stored.worker_ids == ["w1", "w2"]


# --- requeued, reaped, given back -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_requeued_failed_task_has_no_expiry_and_reads_running_once_claimed(
    redis_client: redis.Redis,
) -> None:
    result = examples().always_fails.enqueue("x")
    burst()
    key = KEYS.task_result(result.id)
    assert examples().always_fails.get_result(result.id).status == Status.FAILED
    assert redis_client.ttl(key) > 0
    q = get_queue(QUEUE)
    assert q.requeue(result.id) == 1
    waiting = examples().always_fails.get_result(result.id)
    assert waiting.status == Status.READY and waiting.finished_at is None
    assert redis_client.ttl(key) == -1  # it may wait longer than a finished task is kept
    (delivery,) = q.claim(1)
    claimed = examples().always_fails.get_result(result.id)  # before its RUNNING write
    assert claimed.status == Status.RUNNING and claimed.finished_at is None
    runner._Attempt("w2", delivery, q, "{}").write(RUNNING).run(q.client)
    running = examples().always_fails.get_result(result.id)
    assert running.status == Status.RUNNING and running.finished_at is None
    assert redis_client.hget(key, "status") == RUNNING.encode()
    assert not redis_client.hexists(key, "finished_at") and redis_client.ttl(key) == -1


@pytest.mark.django_db(transaction=True)
def test_a_requeued_task_that_fails_again_ends_failed_with_an_expiry(
    redis_client: redis.Redis,
) -> None:
    result = examples().always_fails.enqueue("x")
    burst()
    assert get_queue(QUEUE).requeue(result.id) == 1
    burst()
    done = examples().always_fails.get_result(result.id)
    assert done.status == Status.FAILED and done.finished_at is not None
    assert len(done.errors) == 6
    assert redis_client.ttl(KEYS.task_result(result.id)) > 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("way_back", ["reaped", "given back"])
def test_a_running_task_whose_message_waits_again_reads_ready(
    redis_client: redis.Redis, way_back: str
) -> None:
    """Its worker died (reap: retry) or gave it back unstarted at a shutdown (release: ready)
    after its RUNNING write landed: it waits to run again."""
    result = examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    runner._Attempt("w1", delivery, q, "{}").write(RUNNING).run(q.client)
    assert examples().add.get_result(result.id).status == Status.RUNNING
    if way_back == "reaped":
        assert q.reap(now_ms=delivery.claimed_ms + 10**9).retried == 1
    else:
        assert q.release(delivery) == 1
    assert examples().add.get_result(result.id).status == Status.READY


# --- priority ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_whole_float_priority_reaches_the_worker(redis_client: redis.Redis) -> None:
    examples().add.using(priority=5.0).enqueue(1, 2)
    (delivery,) = get_queue(QUEUE).claim(1)
    assert delivery.payload["priority"] == 5 and type(delivery.payload["priority"]) is int
    record = TaskRecord.from_payload(delivery.payload, QUEUE, 0, 0)
    assert record.priority == 5


@pytest.mark.parametrize(("given", "read"), [(5.0, 5), (-3, -3), (2.5, 0), ("5", 0), (None, 0)])
def test_a_payload_priority_is_read_as_a_whole_number_or_0(given: Any, read: int) -> None:
    """5.0 is what an enqueue before the fix wrote for ``priority=5.0``: still 5."""
    payload = {"django.task": "task_examples.add", "args": [], "priority": given}
    assert TaskRecord.from_payload(payload, QUEUE, 0, 0).priority == read


# --- a value that is not JSON -----------------------------------------------------------------


def test_a_record_whose_return_value_nests_too_deep_to_read_is_corrupt() -> None:
    # As an earlier version could store it. Before: RecursionError (a 500 in the admin's list).
    stored = {"enqueued": TaskRecord("t.f", QUEUE, 0, "default", [], {}).enqueued_json()}
    stored |= {"status": SUCCESSFUL, "return_value": "[" * 100_000 + "]" * 100_000}
    with pytest.raises(CorruptEnvelope, match="RecursionError"):
        TaskRecord.from_hash(stored)


@pytest.mark.django_db(transaction=True)
def test_a_non_json_return_value_is_rejected_even_when_failed_cannot_be_written(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task ran: a retry would run it again, so the Reject stands when Redis refuses the
    FAILED write (here a key of the wrong type: a real error from Redis)."""
    written = runner._Attempt.write
    broken = KEYS.task_result("not-a-hash")
    redis_client.set(broken, "x")

    def failing(self: runner._Attempt, status: str, **kwargs: Any) -> ScriptCall:
        call = written(self, status, **kwargs)
        return call._replace(keys=[broken]) if status == FAILED else call

    monkeypatch.setattr(runner._Attempt, "write", failing)
    result = examples().returns_a_set.enqueue()
    burst()
    assert redis_client.hget(KEYS.attempts, result.id) == b"1"  # not run again
    assert redis_client.zscore(KEYS.garbage, result.id) is not None
    assert b"not JSON" in (redis_client.hget(KEYS.reasons, result.id) or b"")
