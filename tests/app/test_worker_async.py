"""The worker's async handlers: ``async def`` receivers of a queue's signal (alone and beside sync
ones) and ``async def`` tasks, on the consumer's one event loop (worker.py, dispatch.py,
tasks/runner.py ``arun``), with a real Redis and SQLite."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import SynchronousOnlyOperation
from django.test import override_settings
from waiting import wait_until

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.core.consumer.limits.stopped import time_limit_reason
from django_delayqueue.tasks import framework
from django_delayqueue.worker import Worker

QUEUE = "work-async"
KEYS = QueueKeys("dq", QUEUE)
TASK_QUEUE = "shop-tasks"
TASK_KEYS = QueueKeys("dq", TASK_QUEUE)
EMPTY = dict.fromkeys(("pending", "ready", "unack", "retry", "garbage"), 0)


def with_queues(**queues: dict[str, Any]) -> Any:
    merged = {**settings.DELAYQUEUE["QUEUES"], **queues}
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": merged})


@pytest.fixture(autouse=True)
def work_queue() -> Iterator[None]:
    with with_queues(**{QUEUE: {"max_attempts": 3, "backoff_base": 0, "backoff_max": 0}}):
        yield


@pytest.fixture
def receivers(redis_client: redis.Redis) -> Iterator[Callable[[Callable[..., Any]], None]]:
    connected: list[Callable[..., Any]] = []

    def connect(fn: Callable[..., Any]) -> None:
        dq.topic(QUEUE).connect(fn, weak=False)
        connected.append(fn)

    yield connect
    for fn in connected:
        dq.topic(QUEUE).disconnect(fn)


def burst(queue: str = QUEUE) -> Worker:
    worker = Worker.for_queues([queue], burst=True)
    assert worker.run() == 0
    return worker


def reason(client: redis.Redis, keys: QueueKeys, message_id: str) -> str:
    value = client.hget(keys.reasons, message_id)
    assert value is not None, f"no reason for {message_id}"
    return value.decode()


# --- signals --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_async_receivers_run_at_once_on_one_thread(receivers: Any, running: Any) -> None:
    size = 100
    seen: dict[str, Any] = {"waiting": 0, "threads": set(), "event": None}

    async def receiver(message: dq.Message, **kwargs: Any) -> None:
        seen["threads"].add(threading.get_ident())
        if seen["event"] is None:
            seen["event"] = asyncio.Event()
        seen["waiting"] += 1
        if seen["waiting"] == size:
            seen["event"].set()
        await asyncio.wait_for(seen["event"].wait(), 20)

    receivers(receiver)
    with with_queues(**{QUEUE: {"concurrency": size}}):
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        running(worker)
        for i in range(size):
            dq.schedule(QUEUE, i, on_commit=False)
        wait_until(lambda: worker.delivered == size)
        # Acked: recorded with a round trip after delivered counts the outcomes.
        wait_until(lambda: dq.get_queue(QUEUE).counts() == EMPTY)
    assert seen["threads"] == {worker.coroutines.thread_ident}
    # One handler thread for the queue, not one per concurrent handler.
    assert len([t for t in threading.enumerate() if t.name.startswith(f"delayqueue-{QUEUE}-")]) == 1


@pytest.mark.django_db(transaction=True)
def test_sync_and_async_receivers_of_one_queue(receivers: Any) -> None:
    ran: list[tuple[str, str]] = []
    loop_threads: set[int] = set()

    def sync_receiver(message: dq.Message, **kwargs: Any) -> str:
        ran.append(("sync", threading.current_thread().name))
        return "sync"

    async def async_receiver(message: dq.Message, **kwargs: Any) -> str:
        await asyncio.sleep(0)
        loop_threads.add(threading.get_ident())
        ran.append(("async", threading.current_thread().name))
        return "async"

    receivers(sync_receiver)
    receivers(async_receiver)
    dq.schedule(QUEUE, {}, on_commit=False)
    worker = burst()
    assert worker.delivered == 1
    assert sorted(kind for kind, _ in ran) == ["async", "sync"]
    where = dict(ran)
    assert where["async"] == "delayqueue-event-loop"  # on the loop
    assert where["sync"] != "delayqueue-event-loop"  # beside it, in a thread (sync_to_async)
    assert dq.get_queue(QUEUE).counts() == EMPTY


@pytest.mark.django_db(transaction=True)
def test_a_failing_receiver_of_a_mixed_queue_retries_the_message(
    redis_client: redis.Redis, receivers: Any
) -> None:
    calls = {"sync": 0, "async": 0}

    def sync_receiver(message: dq.Message, **kwargs: Any) -> None:
        calls["sync"] += 1

    async def async_receiver(message: dq.Message, **kwargs: Any) -> None:
        calls["async"] += 1
        raise ValueError("gateway down")

    receivers(sync_receiver)
    receivers(async_receiver)
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    for _ in range(3):
        burst()
        if redis_client.zcard(KEYS.garbage):
            break
    assert calls == {"sync": 3, "async": 3}  # every receiver ran on every attempt
    assert reason(redis_client, KEYS, message_id) == (
        "no attempts left (3 of 3): ValueError: gateway down"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "raised, state, expected",
    [
        (dq.Retry(delay=3600, reason="later"), "retry", "later"),
        (dq.Reject("never"), "garbage", "never"),
        (KeyboardInterrupt("not the loop's"), "retry", "KeyboardInterrupt: not the loop's"),
    ],
)
def test_what_an_async_receiver_raises(
    redis_client: redis.Redis, receivers: Any, raised: BaseException, state: str, expected: str
) -> None:
    async def receiver(message: dq.Message, **kwargs: Any) -> None:
        raise raised

    receivers(receiver)
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    dq.schedule(QUEUE, "after it", on_commit=False)
    with with_queues(**{QUEUE: {"max_attempts": 5, "backoff_base": 60, "backoff_max": 60}}):
        worker = burst()
    assert worker.delivered == 2  # the loop went on
    counts = dq.get_queue(QUEUE).counts()
    assert counts[state] == 2
    assert reason(redis_client, KEYS, message_id) == expected


@pytest.mark.django_db(transaction=True)
def test_the_orm_from_an_async_receiver(redis_client: redis.Redis, receivers: Any) -> None:
    outcomes: list[str] = []

    async def receiver(message: dq.Message, **kwargs: Any) -> None:
        if message.payload == "sync orm":
            Group.objects.create(name="not from a coroutine")  # Django refuses it
        else:
            await sync_to_async(Group.objects.create)(name="through sync_to_async")
        outcomes.append(message.payload)

    receivers(receiver)
    refused = dq.schedule(QUEUE, "sync orm", on_commit=False)
    dq.schedule(QUEUE, "async orm", on_commit=False)
    with with_queues(**{QUEUE: {"max_attempts": 5, "backoff_base": 60, "backoff_max": 60}}):
        burst()
    assert outcomes == ["async orm"]
    assert list(Group.objects.values_list("name", flat=True)) == ["through sync_to_async"]
    assert reason(redis_client, KEYS, refused).startswith(SynchronousOnlyOperation.__name__)


@pytest.mark.django_db(transaction=True)
def test_an_async_receiver_past_its_time_limit_is_retried(
    redis_client: redis.Redis, receivers: Any, running: Any
) -> None:
    async def receiver(message: dq.Message, **kwargs: Any) -> None:
        await asyncio.sleep(3600)

    receivers(receiver)
    queue = {"time_limit": 0.5, "max_attempts": 5, "backoff_base": 60, "backoff_max": 60}
    with with_queues(**{QUEUE: queue}):
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        running(worker)
        message_id = dq.schedule(QUEUE, {}, on_commit=False)
        wait_until(lambda: redis_client.zscore(KEYS.retry, message_id) is not None)
    assert reason(redis_client, KEYS, message_id) == time_limit_reason(0.5)


# --- tasks ----------------------------------------------------------------------------------------


@pytest.fixture
def async_tasks(redis_client: redis.Redis) -> Iterator[Any]:
    from tests.settings import TASKS_SETTING

    queues = {TASK_QUEUE: {"max_attempts": 2, "backoff_base": 0, "backoff_max": 0}}
    with with_queues(**queues), override_settings(TASKS=TASKS_SETTING):
        import async_task_examples

        async_task_examples.SEEN.update(threads=set(), running=0, most=0)
        async_task_examples.GATE.clear()
        yield async_task_examples


@pytest.mark.django_db(transaction=True)
def test_async_tasks_run_at_once_and_store_their_results(async_tasks: Any, running: Any) -> None:
    size = 50
    async_tasks.GATE["size"] = size
    with with_queues(**{TASK_QUEUE: {"concurrency": size}}):
        results = [async_tasks.crowd.enqueue(i) for i in range(size)]
        worker = Worker.for_queues([TASK_QUEUE], idle_seconds=0.1)
        running(worker)
        wait_until(lambda: worker.delivered == size)
        # The results are written with the round trip after delivered counts the outcomes.
        wait_until(lambda: dq.get_queue(TASK_QUEUE).counts() == EMPTY)
    assert async_tasks.SEEN["most"] == size  # all waited at once
    assert async_tasks.SEEN["threads"] == {worker.coroutines.thread_ident}
    for i, result in enumerate(results):
        stored = async_tasks.crowd.get_result(result.id)
        assert stored.status == framework.SUCCESSFUL
        assert stored.return_value == i * 2
        assert stored.worker_ids == [worker.name]


@pytest.mark.django_db(transaction=True)
def test_an_async_task_that_fails_retries_then_fails(async_tasks: Any) -> None:
    result = async_tasks.fails_async.enqueue("x")
    context = async_tasks.knows_its_attempt.enqueue()
    for _ in range(3):
        burst(TASK_QUEUE)
    stored = async_tasks.fails_async.get_result(result.id)
    assert str(stored.status).endswith("FAILED")
    assert [e.exception_class_path for e in stored.errors] == ["builtins.RuntimeError"] * 2
    assert async_tasks.knows_its_attempt.get_result(context.id).return_value == 1


@pytest.mark.django_db(transaction=True)
def test_an_async_task_that_asks_for_a_retry(redis_client: redis.Redis, async_tasks: Any) -> None:
    result = async_tasks.retries_async.enqueue()
    burst(TASK_QUEUE)
    assert redis_client.zscore(TASK_KEYS.retry, result.id) is not None
    stored = async_tasks.retries_async.get_result(result.id)
    assert str(stored.status).endswith("READY") and stored.errors == []


@pytest.mark.django_db(transaction=True)
def test_an_async_task_past_its_time_limit(
    redis_client: redis.Redis, async_tasks: Any, running: Any
) -> None:
    queue = {"time_limit": 0.5, "max_attempts": 1}
    with with_queues(**{TASK_QUEUE: queue}):
        result = async_tasks.hangs_async.enqueue()
        worker = Worker.for_queues([TASK_QUEUE], idle_seconds=0.1)
        running(worker)
        wait_until(lambda: redis_client.zscore(TASK_KEYS.garbage, result.id) is not None)
    stored = async_tasks.hangs_async.get_result(result.id)
    assert str(stored.status).endswith("FAILED")
    [error] = stored.errors
    assert error.exception_class_path == "asyncio.exceptions.CancelledError"
    assert time_limit_reason(0.5) in error.traceback
    assert time_limit_reason(0.5) in reason(redis_client, TASK_KEYS, result.id)


@pytest.mark.django_db(transaction=True)
def test_connections_are_checked_around_an_async_message_off_the_loop(receivers: Any) -> None:
    from unittest import mock

    checked_on: list[str] = []

    async def receiver(message: dq.Message, **kwargs: Any) -> None:
        checked_on.append("receiver")

    receivers(receiver)
    dq.schedule(QUEUE, {}, on_commit=False)
    with mock.patch(
        "django_delayqueue.worker.close_old_connections",
        lambda: checked_on.append(threading.current_thread().name),
    ):
        burst()
    # Before and after the receiver, on the thread its sync_to_async calls use, not the loop's.
    assert len(checked_on) >= 3 and "receiver" in checked_on[1:-1]
    assert "delayqueue-event-loop" not in checked_on


@pytest.mark.django_db(transaction=True)
def test_the_soft_limit_is_raised_in_each_async_receiver(
    redis_client: redis.Redis, receivers: Any, running: Any
) -> None:
    seen: list[str] = []

    def waits(name: str, cleans_up: bool) -> Callable[..., Any]:
        async def receiver(message: dq.Message, **kwargs: Any) -> str:
            try:
                await asyncio.sleep(3600)
            except dq.SoftTimeLimitExceeded:
                seen.append(name)
                if not cleans_up:
                    raise
                await asyncio.sleep(0)  # its clean-up may await
            return name

        return receiver

    receivers(waits("first", cleans_up=True))
    receivers(waits("second", cleans_up=True))
    queue = {"soft_time_limit": 0.3, "time_limit": 60, "backoff_base": 60, "backoff_max": 60}
    with with_queues(**{QUEUE: queue}):
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        running(worker)
        dq.schedule(QUEUE, {}, on_commit=False)
        wait_until(lambda: worker.delivered == 1)
        assert sorted(seen) == ["first", "second"]
        # Both cleaned up and returned: acked (recorded with a round trip after delivered
        # counts the outcome).
        wait_until(lambda: dq.get_queue(QUEUE).counts() == EMPTY)

        receivers(waits("third", cleans_up=False))
        message_id = dq.schedule(QUEUE, {}, on_commit=False)
        wait_until(lambda: redis_client.zscore(KEYS.retry, message_id) is not None)
    assert reason(redis_client, KEYS, message_id).startswith("SoftTimeLimitExceeded")


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_async_task_reads_as_its_canceller_says(
    redis_client: redis.Redis, async_tasks: Any, running: Any
) -> None:
    queue = {"max_attempts": 5, "backoff_base": 60, "backoff_max": 60, "concurrency": 2}
    with with_queues(**{TASK_QUEUE: queue}):
        aborted = async_tasks.hangs_async.enqueue()
        limited = async_tasks.hangs_async.enqueue()
        worker = Worker.for_queues([TASK_QUEUE], idle_seconds=0.1)
        running(worker)
        wait_until(lambda: len(worker.running_handlers()) == 2)
        tokens = {r.message.id: r.message.token for r in worker.running_handlers()}
        # What dq.abort does once its grace is over: dead, whatever attempts are left ...
        assert worker.coroutines.cancel(TASK_QUEUE, tokens[aborted.id], "aborted: by staff", "dead")
        # ... and what a time limit does: retried.
        assert worker.coroutines.cancel(TASK_QUEUE, tokens[limited.id], time_limit_reason(9))
        wait_until(lambda: redis_client.zscore(TASK_KEYS.garbage, aborted.id) is not None)
        wait_until(lambda: redis_client.zscore(TASK_KEYS.retry, limited.id) is not None)
    assert reason(redis_client, TASK_KEYS, aborted.id) == "aborted: by staff"
    assert str(async_tasks.hangs_async.get_result(aborted.id).status).endswith("FAILED")
    assert str(async_tasks.hangs_async.get_result(limited.id).status).endswith("READY")


def test_a_coroutine_dropped_at_close_keeps_its_message_until_its_sync_part_ends() -> None:
    # A stop gave up on a coroutine whose sync receivers run on asgiref's thread: the loop
    # closes without it, but the thread runs on (in-process: --burst, a library Worker.run).
    # Released then, its message would stop being extended and come back beside that code.
    from django_delayqueue.core import Message
    from django_delayqueue.core.consumer.handlers.coroutines import HandlerCoroutines
    from django_delayqueue.core.journal import RETRY
    from django_delayqueue.dispatch import in_thread_to_its_end

    in_sync, release = threading.Event(), threading.Event()

    def sync_receivers() -> None:
        in_sync.set()
        release.wait(60)

    class Deliverer:
        def runs_async(self, message: Message) -> bool:
            return True

        def time_limits(self, message: Message) -> tuple[float | None, float | None]:
            return None, None

        async def adeliver(self, message: Message) -> Any:
            await in_thread_to_its_end(sync_receivers)

    outcomes: list[Any] = []
    runner = HandlerCoroutines(Deliverer())
    try:
        runner.start(Message("m1", "q", None, 0, 0, 1, "t1"), outcomes.append)
        assert in_sync.wait(60)
        assert runner.cancel_all("stopping at once") == 1  # it waits on for its thread
        runner.close()  # gives up on it after STOP_WAIT_SECONDS
        loop_thread = runner._thread
        assert loop_thread is not None
        wait_until(lambda: not loop_thread.is_alive())  # the loop is gone, dropped ones seen
        assert outcomes == []  # still held: given up on, extended, never redelivered
    finally:
        release.set()
    wait_until(lambda: outcomes)
    (outcome,) = outcomes
    assert (outcome.message.id, outcome.status) == ("m1", RETRY)
