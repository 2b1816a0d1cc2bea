"""A task's result record through requeues, reaps and late writes (django_delayqueue.tasks).

What ``get_result`` says of a task whose message went round again (requeued from the dead
letters, reaped, given back at a shutdown), what ``write_record.lua`` keeps when writes of two
deliveries land out of order, and the record's expiry: a record expires only once its task
ended, never while it may still run. Against the session's real Redis, on the demo's task
queue (the fixture of test_tasks_backend).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import test_tasks_backend as backend_tests
from redis.backoff import NoBackoff
from redis.retry import Retry
from test_tasks_backend import KEYS, QUEUE, burst, tasks_on_the_demo_queue  # noqa: F401

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.consumer.outcomes import ACK, Outcome, WhileRunning
from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
from django_delayqueue.core.errors import CorruptEnvelope, RedisUnavailable
from django_delayqueue.core.scripts.calls import ScriptBatch, ScriptCall
from django_delayqueue.core.scripts.contracts import WRITE_RECORD
from django_delayqueue.core.task_records import record_fields
from django_delayqueue.tasks import framework, results, return_values, runner
from django_delayqueue.tasks.attempt import Attempt
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


def from_message(delivery: Any, q: Any) -> TaskRecord:
    """The record a delivery's message tells (what the runner gives its attempt)."""
    return TaskRecord.from_payload(
        delivery.payload, q.logical_name, delivery.due_ms, delivery.scheduled_ms
    )


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
    first = Attempt("w1", stalled, q, from_message(stalled, q))
    second = Attempt("w2", again, q, from_message(again, q))
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
    Attempt("w2", delivery, q, from_message(delivery, q)).write(RUNNING).run(q.client)
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
    Attempt("w1", delivery, q, from_message(delivery, q)).write(RUNNING).run(q.client)
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
    written = Attempt.write
    broken = KEYS.task_result("not-a-hash")
    redis_client.set(broken, "x")

    def failing(self: Attempt, status: str, **kwargs: Any) -> ScriptCall:
        call = written(self, status, **kwargs)
        return call._replace(keys=[broken]) if status == FAILED else call

    monkeypatch.setattr(Attempt, "write", failing)
    result = examples().returns_a_set.enqueue()
    burst()
    assert redis_client.hget(KEYS.attempts, result.id) == b"1"  # not run again
    assert redis_client.zscore(KEYS.garbage, result.id) is not None
    assert b"not JSON" in (redis_client.hget(KEYS.reasons, result.id) or b"")


# --- what a delivery costs: the worker's hot path -------------------------------------------


def redis_commands(client: redis.Redis) -> dict[str, int]:
    """The commands the test's redis-server ran since the last CONFIG RESETSTAT, by name."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }


@pytest.mark.django_db(transaction=True)
def test_a_task_s_run_writes_its_result_once_with_the_ack_in_five_commands(
    redis_client: redis.Redis,
) -> None:
    """A task that ends before the consumer's next round trip: its RUNNING write is never
    built, never sent (handed over as the run, which ended), its result is one
    write_record call of five commands."""
    result = examples().add.enqueue(2, 3)
    q = get_queue(QUEUE)
    q.load_record_script()
    (delivery,) = q.claim(1)
    early: list[Any] = []
    writes = runner.TaskRunner("w1", lambda queue, call: early.append(call)).run(delivery, q)
    (running,) = early
    assert isinstance(running, WhileRunning) and running.ended and running.taken is None
    assert writes.supersedes is None  # the loop never built it: nothing to leave out
    redis_client.config_resetstat()
    writes.call.run(q.client)
    assert redis_commands(redis_client) == {
        "evalsha": 1, "hmget": 1, "hdel": 1, "hset": 1, "expire": 1,
    }  # fmt: skip
    done = examples().add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL  # its end, written: read before its ack too
    assert done.worker_ids == ["w1"] and done.started_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_superseded_running_write_leaves_the_same_record_as_one_sent(
    redis_client: redis.Redis,
) -> None:
    """Coalescing: a short task's result, sent without its RUNNING write before it, carries
    everything RUNNING sets (started_at, last_attempted_at, its worker, what enqueue wrote):
    the end record is the one both writes leave, field for field, expiry included."""
    result = examples().add.enqueue(2, 3)
    key = KEYS.task_result(result.id)
    enqueued = redis_client.hgetall(key)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    early: list[Any] = []
    writes = runner.TaskRunner("w1", lambda queue, call: early.append(call)).run(delivery, q)
    (running,) = early
    assert running.ended  # never sent by a consumer: the task ended before its next round
    assert running.call().run(q.client) == 1  # sent, as for a task still running by then
    assert redis_client.hget(key, "status") == RUNNING.encode()
    assert writes.call.run(q.client) == [b"1"]
    both, both_ttl = redis_client.hgetall(key), redis_client.ttl(key)
    redis_client.delete(key)
    redis_client.hset(key, mapping=enqueued)  # the record as enqueue left it, again
    assert writes.call.run(q.client) == [b"1"]  # superseded: the result alone
    alone, alone_ttl = redis_client.hgetall(key), redis_client.ttl(key)
    assert alone == both
    assert alone[b"status"] == SUCCESSFUL.encode() and b"started_at" in alone
    assert abs(alone_ttl - both_ttl) <= 1 and alone_ttl > 0
    done = examples().add.get_result(result.id)
    assert done.worker_ids == ["w1"] and done.attempts == 1
    assert done.started_at is not None and done.last_attempted_at == done.started_at


@pytest.mark.django_db(transaction=True)
def test_a_task_still_running_at_the_next_round_gets_its_running_write_whole(
    redis_client: redis.Redis,
) -> None:
    """A quiet first attempt builds neither its record nor an Attempt; the RUNNING write the
    consumer builds of it while the task runs (here: at once, as a round that came then) is
    still whole: a record gone (deleted by hand) is rebuilt with what enqueue wrote, its
    start and its worker, the ones its success then writes too."""
    result = examples().add.enqueue(4, 5)
    key = KEYS.task_result(result.id)
    redis_client.delete(key)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    seen: list[Any] = []

    def round_during_the_run(queue: Any, call: Any) -> None:
        assert not call.ended  # handed over before the task runs
        assert call.call().run(queue.client) == 1
        seen.append(examples().add.get_result(result.id))

    writes = runner.TaskRunner("w1", round_during_the_run).run(delivery, q)
    (running,) = seen
    assert running.status == framework.TaskResultStatus.RUNNING
    assert (running.args, running.kwargs, running.worker_ids) == ([4, 5], {}, ["w1"])
    assert running.started_at is not None and running.last_attempted_at == running.started_at
    assert redis_client.hexists(key, "enqueued")
    assert writes.call.run(q.client) == [b"1"]  # the record is whole again: no -1
    done = examples().add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 9
    assert (done.started_at, done.worker_ids) == (running.started_at, ["w1"])


@pytest.mark.django_db(transaction=True)
def test_a_running_write_built_after_a_task_changed_its_arguments_has_them_as_enqueued(
    redis_client: redis.Redis,
) -> None:
    """Arguments a task could change in place (a list, a dict): its RUNNING write, built by
    the consumer's thread while (or after) the task changed them, writes them as enqueued.
    Built of the message's payload then, it wrote what the task left (empty ones)."""
    result = examples().empties_its_arguments.enqueue([1, 2], options={"a": 3})
    key = KEYS.task_result(result.id)
    redis_client.delete(key)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    early: list[Any] = []
    writes = runner.TaskRunner("w1", lambda queue, call: early.append(call)).run(delivery, q)
    (running,) = early
    assert running.call().run(q.client) == 1  # built now: the task emptied its arguments
    seen = examples().empties_its_arguments.get_result(result.id)
    assert seen.args == [[1, 2]] and seen.kwargs == {"options": {"a": 3}}
    assert writes.call.run(q.client) == [b"1"]
    assert examples().empties_its_arguments.get_result(result.id).return_value == 6


@pytest.mark.django_db(transaction=True)
def test_a_running_write_built_late_is_the_attempt_s_running_write(
    redis_client: redis.Redis,
) -> None:
    """RUNNING's arguments are built when the round trip sends them, from the attempt's own
    fields: the same write as one built at once, and it lands as one."""
    result = examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    attempt = Attempt("w1", delivery, q, from_message(delivery, q))
    late = attempt.call()
    assert list(late.args) == list(attempt.write(RUNNING, whole=True).args)
    assert late.keys == [KEYS.task_result(result.id)]
    assert late.run(q.client) == 1
    assert redis_client.hget(KEYS.task_result(result.id), "status") == RUNNING.encode()


def test_enqueueing_a_task_of_priority_0_costs_seven_commands(redis_client: redis.Redis) -> None:
    """One script: the message (pending or ready, the messages hash, the wake), the record; the
    ranked zset and the priorities hash are neither read nor written for priority 0."""
    examples().add.enqueue(0, 0)  # the script loaded, the clock read
    redis_client.config_resetstat()
    examples().add.enqueue(1, 2)
    assert redis_commands(redis_client) == {
        "evalsha": 1, "type": 2, "hsetnx": 1, "rpush": 1, "publish": 1, "hset": 1,
    }  # fmt: skip


def test_a_priority_task_checks_the_ranked_keys_before_writing(redis_client: redis.Redis) -> None:
    """Priority 0 leaves the ranked zset and priorities hash alone, whatever they hold; a
    priority task is refused, changing nothing, when one holds the wrong type."""
    redis_client.set(KEYS.priorities, "not a hash")
    ok = examples().add.enqueue(1, 2)
    assert examples().add.get_result(ok.id).status == Status.READY
    with pytest.raises(Exception, match="WRONGTYPE"):
        examples().add.using(priority=5).enqueue(3, 4)
    assert redis_client.llen(KEYS.ready) == 1 and redis_client.get(KEYS.priorities)


# --- the framework's objects a run sends --------------------------------------------------------


def test_the_task_as_enqueued_is_kept_per_task_and_options() -> None:
    add = examples().add

    def record(priority: int, queue: str = QUEUE, run_after: int | None = None) -> TaskRecord:
        return TaskRecord(add.module_path, queue, priority, "default", [], {}, run_after=run_after)

    first = results.task_as_enqueued(add, record(3))
    assert results.task_as_enqueued(add, record(3)) is first  # the same options: kept
    assert (first.priority, first.queue_name, first.run_after) == (3, QUEUE, None)
    other = results.task_as_enqueued(add, record(-7, "other", 1_700_000_000_000))
    assert (other.priority, other.queue_name) == (-7, "other")
    assert other.run_after == results.to_datetime(1_700_000_000_000)
    assert results.task_as_enqueued(add, record(3)).priority == 3
    assert add.priority == 0 and add.queue_name == QUEUE  # the task itself is unchanged


def test_the_finished_result_is_what_a_result_built_whole_would_be() -> None:
    add = examples().add
    record = TaskRecord(add.module_path, QUEUE, 2, "default", [1, [2]], {"k": {"v": 3}})
    record.enqueued_at, record.started_at, record.last_attempted_at = 1000, 2000, 2000
    record.status, record.worker_ids = RUNNING, ["w1"]
    task = results.task_as_enqueued(add, record)
    started = results.to_task_result(record, "id-1", task)
    assert started.status == Status.RUNNING and started.args == [1, [2]]
    record.status, record.finished_at, record.return_value = SUCCESSFUL, 3000, {"sum": 3}
    record.errors = [{"exception_class_path": "x.Y", "traceback": "tb"}]
    finished = results.finished_result(started, record)
    whole = results.to_task_result(record, "id-1", task)
    names = [f.name for f in dataclasses.fields(framework.TaskResult)]
    assert [getattr(finished, n) for n in names] == [getattr(whole, n) for n in names]
    assert finished.return_value == {"sum": 3} and finished.status == framework.SUCCESSFUL
    assert started.status == Status.RUNNING and started.finished_at is None  # left as it was


@pytest.mark.parametrize(
    "value", [None, True, False, 0, -7, 10**18 - 1, -(10**18) + 1, 10**18, 10**40, 1.5, "é", [1]]
)
def test_a_return_value_s_short_cut_stores_what_the_encoder_would(value: Any) -> None:
    """The common return values (None, a bool, a small int) skip normalising, encoding and
    decoding: stored as the same text, read back as the same value, as the full path."""
    from django_delayqueue.core.envelope import encode_json

    text = encode_json(return_values._normalized(value), "return value", ascii_only=True)
    assert runner._stored(value) == (text, json.loads(text))
    assert type(runner._stored(value)[1]) is type(json.loads(text))


# --- a record gone before its task ends: written whole again ----------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_write_that_requires_a_field_leaves_a_record_without_it_alone(
    redis_client: redis.Redis,
) -> None:
    """write_record.lua's ARGV[4]: a record without that field is not written (-1), so that
    the caller can write it whole; one with it is written as without ARGV[4]."""
    q = get_queue(QUEUE)
    key = KEYS.task_result("gone")
    fields = record_fields([], ["status", RUNNING], [], [])
    gone = ScriptCall(WRITE_RECORD.script, [key], [0, 2, fields, "enqueued"])
    assert gone.run(q.client) == -1
    assert not redis_client.exists(key)
    redis_client.hset(key, "enqueued", "{}")
    assert gone.run(q.client) == 1
    assert redis_client.hget(key, "status") == RUNNING.encode()


@pytest.mark.django_db(transaction=True)
def test_a_record_deleted_before_its_task_succeeds_is_written_whole(
    redis_client: redis.Redis,
) -> None:
    """A task's end leaves out the record's "enqueued" (the record has it since enqueue);
    a record gone meanwhile is written whole after the ack, arguments as enqueued."""
    result = examples().add.enqueue(2, 3)
    redis_client.delete(KEYS.task_result(result.id))
    burst()
    done = examples().add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 5
    assert done.args == [2, 3] and done.worker_ids == ["test-worker"]
    assert redis_client.ttl(KEYS.task_result(result.id)) > 0


@pytest.mark.django_db(transaction=True)
def test_a_record_deleted_before_its_task_fails_is_written_whole(
    redis_client: redis.Redis,
) -> None:
    """The same for the writes of a failed attempt (READY, then FAILED on the last)."""
    result = examples().always_fails.enqueue("x")
    redis_client.delete(KEYS.task_result(result.id))
    burst()
    done = examples().always_fails.get_result(result.id)
    assert done.status == Status.FAILED and done.args == ["x"]
    assert len(done.errors) == 3  # every attempt's (max_attempts 3 on the demo queue)


@pytest.mark.django_db(transaction=True)
def test_a_rebuilt_record_has_the_arguments_as_enqueued_not_as_the_task_left_them(
    redis_client: redis.Redis,
) -> None:
    """A task that changes its (list, dict) arguments in place: the record written whole
    after it ran still has them as they were enqueued."""
    result = examples().empties_its_arguments.enqueue([1, 2], options={"a": 3})
    redis_client.delete(KEYS.task_result(result.id))
    burst()
    done = examples().empties_its_arguments.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 6
    assert done.args == [[1, 2]] and done.kwargs == {"options": {"a": 3}}


def test_a_task_is_called_as_its_framework_calls_it(redis_client: redis.Redis) -> None:
    """The runner calls a plain task's function directly (what ``Task.call`` does for it);
    an ``async def`` task, or a Task class with a ``call`` of its own, through ``call``."""
    assert runner._call(examples().add, [2, 3], {}) == 5
    assert runner._call(examples().sleeps_async, ["x"], {}) == "async x"  # async_to_sync

    class Counted(framework.Task):  # type: ignore[misc,valid-type]
        def call(self, *args: Any, **kwargs: Any) -> Any:
            return ("counted", super().call(*args, **kwargs))

    counted = object.__new__(Counted)
    for spec in dataclasses.fields(framework.Task):
        object.__setattr__(counted, spec.name, getattr(examples().add, spec.name))
    assert runner._call(counted, [1, 1], {}) == ("counted", 2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [RUNNING, "READY", FAILED, SUCCESSFUL])
@pytest.mark.parametrize("whole", [False, True])
def test_an_attempt_s_fields_are_the_text_record_fields_makes_of_its_lists(
    redis_client: redis.Redis, status: str, whole: bool
) -> None:
    """Attempt.fields writes the four lists out itself: the same text as record_fields, with
    a worker name, a return value and an error that need escaping (quotes, non-ASCII)."""
    from django_delayqueue.tasks.attempt import task_error

    examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    attempt = Attempt('w "é"\\1', delivery, q, from_message(delivery, q))
    error = ValueError('bad "value" é') if status in ("READY", FAILED) else None
    returned = '{"a": "é\\"x"}' if status == SUCCESSFUL else None
    finished_at = attempt.started_at + 5 if status in (FAILED, SUCCESSFUL) else None
    absent: list[Any] = ["started_at", attempt.started_at]
    if whole:
        absent += ["enqueued", attempt.enqueued]
    in_order: list[Any] = ["status", status, "last_attempted_at", attempt.started_at]
    deleted = []
    for name, value in (("finished_at", finished_at), ("return_value", returned)):
        if value is None:
            deleted.append(name)
        else:
            in_order += [name, value]
    always = [f"worker:{delivery.token}", 'w "é"\\1']
    if error is not None:
        always += [f"error:{delivery.token}", json.dumps(task_error(error))]
    text = attempt.fields(status, error, returned, finished_at, whole)
    assert text == record_fields(absent, in_order, deleted, always)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("worker", ["wé", "w\n1 !2", "日本 🎉"])
def test_a_success_s_compact_write_is_read_whole_whatever_the_client_s_encoding(
    redis_server: Any, redis_client: redis.Redis, worker: str
) -> None:
    """REDIS_OPTIONS may set redis-py's ``encoding``: the compact text's length is the return
    value's (ASCII JSON), not the worker id's in UTF-8, which a latin-1 client sent as other
    bytes (review: the worker id took the return value's first byte, silently)."""
    encoding = "latin-1" if worker.isascii() or "é" in worker else "utf-8"
    client = redis.Redis.from_url(redis_server.url, encoding=encoding)
    examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    attempt = Attempt(worker, delivery, q, from_message(delivery, q))
    before = redis_client.hgetall(attempt.key)
    finished_at = attempt.started_at + 5
    left = []
    for call in (
        attempt.write(SUCCESSFUL, returned="[1]", ttl=60, finished_at=finished_at, mergeable=True),
        attempt.success_write("[1]", 60, finished_at),
    ):
        redis_client.delete(attempt.key)
        redis_client.hset(attempt.key, mapping=before)
        call.run(client)
        left.append(redis_client.hgetall(attempt.key))
    assert left[1] == left[0]
    assert left[1][b"return_value"] == b"[1]"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("state", ["as_enqueued", "started_before", "later_landed", "gone"])
@pytest.mark.parametrize(("returned", "ttl"), [("null", 60), ('{"a": "é\\"x y"}', 0)])
def test_a_success_s_compact_write_leaves_the_record_the_general_write_leaves(
    redis_client: redis.Redis, state: str, returned: str, ttl: int
) -> None:
    """Attempt.success_write (write_records.lua's compact success text, the write every task
    that returns makes) leaves what the general write of SUCCESSFUL leaves, and replies the
    same: over a record as enqueue left it, one an earlier attempt started, one a later
    attempt's write reached first (only the worker and an absent start are written), and none
    (-1, nothing written); with a worker id and a return value that need escaping in JSON."""
    from django_delayqueue.core.consumer.rounds.merged_writes import merged_writes, record_replies

    examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    attempt = Attempt('w "é" 1', delivery, q, from_message(delivery, q))
    key = attempt.key
    before = {k: v for k, v in redis_client.hgetall(key).items() if k in (b"enqueued", b"status")}
    if state == "started_before":
        before[b"started_at"] = b"123"
    elif state == "later_landed":
        before[b"order"] = str(attempt._order + 9).encode()
    finished_at = attempt.started_at + 5

    def left_by(call: ScriptCall) -> tuple[Any, dict[bytes, bytes], int]:
        redis_client.delete(key)
        if state != "gone":
            redis_client.hset(key, mapping=before)
        reply = record_replies(call.run(redis_client), 1)[0]
        return reply, redis_client.hgetall(key), redis_client.ttl(key)

    general = attempt.write(
        SUCCESSFUL, returned=returned, ttl=ttl, finished_at=finished_at, mergeable=True
    )
    compact = attempt.success_write(returned, ttl, finished_at)
    assert compact.script == general.script and compact.keys == general.keys
    expected = left_by(general)
    assert expected[0] == {"gone": -1, "later_landed": 0}.get(state, 1)
    assert left_by(compact) == expected
    # Both kinds in one call of a round, each written as alone: the compact one first, so
    # that its own reply and record are what is checked (the general one, of the same order,
    # then lands as it would alone and replies the same).
    [(call, _)] = merged_writes([record_entry(compact), record_entry(general)])
    redis_client.delete(key)
    if state != "gone":
        redis_client.hset(key, mapping=before)
    assert record_replies(call.run(redis_client), 2) == [expected[0], expected[0]]
    assert redis_client.hgetall(key) == expected[1]


@pytest.mark.django_db(transaction=True)
def test_a_success_s_compact_write_to_a_key_of_another_type_fails_that_record_alone(
    redis_client: redis.Redis,
) -> None:
    """In one write_records.lua call of a round, a compact success whose record key holds
    another type is refused by its own WRONGTYPE error, worded, and changes nothing; the
    records before and after it are written as alone."""
    from django_delayqueue.core.consumer.rounds.merged_writes import merged_writes, record_replies

    q = get_queue(QUEUE)
    for i in range(3):
        examples().add.enqueue(i, i)
    attempts = [Attempt("w-1", d, q, from_message(d, q)) for d in q.claim(3)]
    broken = attempts[1].key
    redis_client.delete(broken)
    redis_client.set(broken, "not a record")
    writes = [a.success_write("[1]", 60, a.started_at + 5) for a in attempts]
    [(call, _)] = merged_writes([record_entry(w) for w in writes])
    replies = record_replies(call.run(redis_client), 3)
    assert replies[0] == 1 and replies[2] == 1
    assert isinstance(replies[1], redis.exceptions.ResponseError)
    assert "WRONGTYPE" in str(replies[1]) and "nothing was changed" in str(replies[1])
    assert redis_client.get(broken) == b"not a record"
    for a in (attempts[0], attempts[2]):
        assert redis_client.hget(a.key, "status") == b"SUCCESSFUL"
        assert redis_client.hget(a.key, "return_value") == b"[1]"


@pytest.mark.django_db(transaction=True)
def test_a_success_s_compact_write_that_redis_refuses_fails_that_record_alone(
    redis_client: redis.Redis,
) -> None:
    """A kept-seconds value Redis's EXPIRE refuses (a RESULT_TTL of sys.maxsize, "for ever")
    fails its own record only: the round's other results are written and replied to as alone
    (review: the whole call failed, the later records were never written and the round's
    tasks were all reported as refused)."""
    import sys

    from django_delayqueue.core.consumer.rounds.merged_writes import merged_writes, record_replies

    q = get_queue(QUEUE)
    for i in range(3):
        examples().add.enqueue(i, i)
    attempts = [Attempt("w-1", d, q, from_message(d, q)) for d in q.claim(3)]
    ttls = [60, sys.maxsize, 60]
    writes = [
        a.success_write("[1]", t, a.started_at + 5) for a, t in zip(attempts, ttls, strict=True)
    ]
    [(call, _)] = merged_writes([record_entry(w) for w in writes])
    replies = record_replies(call.run(redis_client), 3)
    assert replies[0] == 1 and replies[2] == 1
    assert isinstance(replies[1], redis.exceptions.ResponseError)
    for a in (attempts[0], attempts[2]):
        assert redis_client.hget(a.key, "status") == b"SUCCESSFUL"
        assert 0 < redis_client.ttl(a.key) <= 60


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("worker", ["w1", 'w "é" 1'])
def test_a_run_s_success_write_is_its_attempt_s(redis_client: redis.Redis, worker: str) -> None:
    """A run that built no Attempt makes its success's write itself (core's success_write):
    the same call as its Attempt's success_write, and as merged_record_write of
    success_fields, for the same start and end (read back from the text)."""
    from django_delayqueue.core.task_records import (
        ENQUEUED,
        merged_record_write,
        success_fields,
    )

    examples().add.enqueue(20, 22)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    made = runner.TaskRunner(worker, lambda queue, call: None).run(delivery, q).call
    text = made.args[0].split(" ")
    started_at, finished_at = int(text[3].lstrip("!")), int(text[4])
    ttl = runner._ttl(framework.task_backends["default"])
    attempt = Attempt(worker, delivery, q, from_message(delivery, q), started_at=started_at)
    assert made == attempt.success_write("42", ttl, finished_at)
    fields = success_fields(started_at, finished_at, f"worker:{delivery.token}", worker, "42")
    assert made == merged_record_write(attempt.key, ttl, attempt._order + 1, ENQUEUED, fields)


def record_entry(call: ScriptCall) -> Any:
    from types import SimpleNamespace

    from django_delayqueue.core.consumer.outcomes import WritesWithAck

    return SimpleNamespace(outcome=SimpleNamespace(writes=WritesWithAck(call)))


@pytest.mark.django_db(transaction=True)
def test_a_success_whose_record_is_gone_is_written_whole_with_a_later_round_until_it_lands(
    redis_client: redis.Redis,
) -> None:
    """The whole write of a success whose record went (the write with its ack replied -1)
    goes with the consumer's next round trips, sent again until Redis has it: its message is
    acked by then, so a failure of its first try (here a connection that fails) must not lose
    the result."""
    result = examples().add.enqueue(2, 3)
    key = KEYS.task_result(result.id)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    tasks = runner.TaskRunner("w1", lambda queue, call: unrecorded.write_soon(queue.name, call))
    writes = tasks.run(delivery, q)
    redis_client.delete(key)  # deleted by hand before the task's end lands
    now = q.clock.now_ms()
    unrecorded.extend([Outcome(delivery, ACK, now, now, writes=writes)])

    with socket.socket() as closed:  # a port nothing listens on: a connection that fails
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = redis.Redis(port=port, retry=Retry(NoBackoff(), 0))
    reachable = q.client

    def one_round(client: redis.Redis, then: redis.Redis | None = None) -> None:
        """A round sent on ``client``, its replies read while the queue's client is ``then``
        (what the result's ``then`` callback would use, run as they are read)."""
        batch = ScriptBatch()
        calls = unrecorded.add_to(batch, [q], now, force=True)
        replies = batch.run(client, raise_errors=False)
        q.client = then or reachable
        try:
            unrecorded.read(calls, replies, now)
        finally:
            q.client = reachable

    # The result's write (-1: nothing written) and the ack land; Redis unreachable from then.
    one_round(reachable, then=unreachable)
    assert q.counts()["unack"] == 0 and not redis_client.exists(key)
    with pytest.raises(RedisUnavailable):
        one_round(unreachable)
    assert not redis_client.exists(key) and len(unrecorded) == 1  # kept for the next round
    one_round(reachable)
    assert len(unrecorded) == 0
    done = examples().add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 5
    assert done.args == [2, 3] and done.worker_ids == ["w1"]


@pytest.mark.django_db(transaction=True)
def test_a_stop_right_after_a_success_whose_record_is_gone_still_writes_it_whole(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """At a stop, the ack recorded by the last try of record_left hands over the whole write
    of a task whose record went (write_soon): it is sent all the same (the message is acked,
    that write is its only result), and nothing is logged as left."""
    from django_delayqueue.core.consumer.loop import Consumer
    from django_delayqueue.core.consumer.rounds.left_at_stop import RECORD_RETRY_PAUSE_SECONDS

    result = examples().add.enqueue(2, 3)
    key = KEYS.task_result(result.id)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    consumer = Consumer([q], lambda m: None)
    try:
        tasks = runner.TaskRunner("w1", consumer.write_soon)
        writes = tasks.run(delivery, q)
        redis_client.delete(key)  # deleted by hand before the task's end lands
        now = q.clock.now_ms()
        consumer._unrecorded.extend([Outcome(delivery, ACK, now, now, writes=writes)])
        with caplog.at_level(logging.WARNING, logger="django_delayqueue"):
            # One try (the bound of tries), on a clock that stands still: the ack is recorded
            # by the last try.
            consumer._round_trip.record_left(RECORD_RETRY_PAUSE_SECONDS, lambda: 0.0)
        assert q.counts()["unack"] == 0 and len(consumer._unrecorded) == 0
        assert "not recorded" not in caplog.text and "not sent" not in caplog.text
    finally:
        consumer._threads.close()
        consumer._waiter.close()
    done = examples().add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 5
    assert done.args == [2, 3] and done.worker_ids == ["w1"]
