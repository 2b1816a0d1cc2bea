"""django_delayqueue.worker and registry: signals per queue, dispatch, verdicts, long handlers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import redis
from django.conf import settings
from django.dispatch import Signal
from django.test import override_settings

import django_delayqueue as dq
from django_delayqueue.core import ConfigurationError, ManualClock, Queue, QueueKeys, QueueSettings
from django_delayqueue.worker import Worker

QUEUE = "work"
KEYS = QueueKeys("dq", QUEUE)
WAIT = 15.0


@pytest.fixture(autouse=True)
def work_queue() -> Iterator[None]:
    """A queue of its own, retried at once, so a burst run goes through every attempt."""
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUE: {"max_attempts": 3, "backoff_base": 0, "backoff_max": 0},
    }
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        yield


@pytest.fixture
def receivers() -> Iterator[Callable[[Callable[..., Any]], None]]:
    """Connect receivers to the work queue for the test only."""
    connected: list[Callable[..., Any]] = []

    def connect(fn: Callable[..., Any]) -> None:
        dq.topic(QUEUE).connect(fn, weak=False)
        connected.append(fn)

    yield connect
    for fn in connected:
        dq.topic(QUEUE).disconnect(fn)


def burst(**kwargs: Any) -> Worker:
    worker = Worker.for_queues([QUEUE], burst=True, **kwargs)
    worker.run()
    return worker


def garbage_reason(client: redis.Redis, message_id: str) -> str:
    assert client.zscore(KEYS.garbage, message_id) is not None, "not in garbage"
    return client.hget(KEYS.reasons, message_id).decode()


# --- the registry ---------------------------------------------------------------------------


def test_topic_is_one_signal_per_queue() -> None:
    assert isinstance(dq.topic("a-queue"), Signal)
    assert dq.topic("a-queue") is dq.topic("a-queue")
    assert dq.topic("a-queue") is not dq.topic("b-queue")
    with pytest.raises(ConfigurationError):
        dq.topic("no {braces}")


# --- dispatch -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_receivers_get_the_message_and_returning_acks(
    redis_client: redis.Redis, receivers: Any
) -> None:
    seen: list[tuple[Any, dq.Message]] = []
    receivers(lambda sender, message, **kw: seen.append((sender, message)))
    message_id = dq.schedule(QUEUE, {"n": 1}, on_commit=False)
    worker = burst()
    assert worker.delivered == 1
    ((sender, message),) = seen
    assert sender == QUEUE
    assert (message.id, message.queue, message.payload, message.attempt) == (
        message_id,
        QUEUE,
        {"n": 1},
        1,
    )
    assert message.due_at >= message.scheduled_at
    assert dq.get_queue(QUEUE).counts() == dict.fromkeys(
        ("pending", "ready", "unack", "retry", "garbage"), 0
    )


@pytest.mark.django_db(transaction=True)
def test_no_handler_sends_the_message_to_garbage_with_the_reason(
    redis_client: redis.Redis,
) -> None:
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    burst()
    assert garbage_reason(redis_client, message_id) == "no handler for queue 'work'"


@pytest.mark.django_db(transaction=True)
def test_failing_handler_retries_then_goes_to_garbage(
    redis_client: redis.Redis, receivers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    def fail(message: dq.Message, **kwargs: Any) -> None:
        attempts.append(message.attempt)
        raise ValueError("payment service down")

    receivers(fail)
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    with caplog.at_level(logging.WARNING):
        # One burst normally does it all; on a fresh Redis the first nack.lua call is sent
        # again after NOSCRIPT, i.e. after that round's promote, so allow a second burst.
        for _ in range(3):
            burst()
            if redis_client.zcard(KEYS.garbage):
                break
    assert attempts == [1, 2, 3]
    assert garbage_reason(redis_client, message_id) == (
        "no attempts left (3 of 3): ValueError: payment service down"
    )
    failures = [r for r in caplog.records if r.name == "django_delayqueue.worker"]
    assert len(failures) == 3 and failures[0].exc_info is not None
    # Logged once each, by the worker with the message id: not again by django.dispatch.
    assert not [r for r in caplog.records if r.name == "django.dispatch"]


@pytest.mark.django_db(transaction=True)
def test_retry_asks_for_a_delay(redis_client: redis.Redis, receivers: Any) -> None:
    def later(message: dq.Message, **kwargs: Any) -> None:
        raise dq.Retry(delay=600, reason="not yet")

    receivers(later)
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    before = dq.get_queue(QUEUE).clock.now_ms()
    burst()
    retry_at = redis_client.zscore(KEYS.retry, message_id)
    assert retry_at is not None and retry_at >= before + 600_000
    assert redis_client.hget(KEYS.reasons, message_id) == b"not yet"


@pytest.mark.django_db(transaction=True)
def test_reject_goes_straight_to_garbage_without_error_logs(
    redis_client: redis.Redis, receivers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def reject(message: dq.Message, **kwargs: Any) -> None:
        calls.append(message.attempt)
        raise dq.Reject("order does not exist")

    receivers(reject)
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    with caplog.at_level(logging.DEBUG):
        burst()
    assert calls == [1]
    assert garbage_reason(redis_client, message_id) == "order does not exist"
    # Retry/Reject steer the delivery: neither send_robust's logger nor ours calls them errors.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.django_db(transaction=True)
def test_one_failing_receiver_fails_the_delivery(redis_client: redis.Redis, receivers: Any) -> None:
    ran: list[str] = []
    receivers(lambda **kw: ran.append("ok"))

    def broken(**kwargs: Any) -> None:
        raise dq.Reject("broken")

    receivers(broken)
    message_id = dq.schedule(QUEUE, {}, on_commit=False)
    burst()
    assert ran == ["ok"]  # send_robust still called every receiver
    assert garbage_reason(redis_client, message_id) == "broken"


@pytest.mark.django_db(transaction=True)
def test_handler_threads_close_their_database_connections_when_they_end(
    redis_client: redis.Redis, receivers: Any
) -> None:
    handler_threads: set[str] = set()
    closed_on: list[str] = []
    receivers(lambda **kw: handler_threads.add(threading.current_thread().name))
    dq.schedule(QUEUE, {}, on_commit=False)
    worker = Worker.for_queues([QUEUE], burst=True)
    with mock.patch(
        "django_delayqueue.worker.connections.close_all",
        lambda: closed_on.append(threading.current_thread().name),
    ):
        worker.run()
    # Each handler thread closed its own connections as it ended (Django's are per thread).
    assert handler_threads and handler_threads <= set(closed_on)


@pytest.mark.django_db(transaction=True)
def test_stale_connections_are_closed_around_each_handler(
    redis_client: redis.Redis, receivers: Any
) -> None:
    order: list[str] = []
    receivers(lambda **kw: order.append("handler"))
    dq.schedule(QUEUE, {}, on_commit=False)
    worker = Worker.for_queues([QUEUE], burst=True)
    with mock.patch(
        "django_delayqueue.worker.close_old_connections", lambda: order.append("close")
    ):
        worker.run()
    i = order.index("handler")
    assert order[i - 1 : i + 2] == ["close", "handler", "close"]


def test_for_queues_refuses_unknown_names() -> None:
    with pytest.raises(ConfigurationError, match="unknown queue 'nope'"):
        Worker.for_queues(["nope"])
    with (
        override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": {}}),
        pytest.raises(ConfigurationError, match="no queues"),
    ):
        Worker.for_queues()


def test_worker_takes_journal_and_refresh_settings() -> None:
    config = {**settings.DELAYQUEUE, "JOURNAL_MAXLEN": 7, "SETTINGS_REFRESH_SECONDS": 0.5}
    with override_settings(DELAYQUEUE=config):
        worker = Worker.for_queues()
    assert (worker.journal_maxlen, worker.maintenance_seconds) == (7, 0.5)
    assert [q.name for q in worker.queues] == ["order-close", "activation-sms", QUEUE]


# --- long handlers --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_long_handler_keeps_its_message(redis_client: redis.Redis, receivers: Any) -> None:
    """A handler outliving three visibility timeouts keeps its message (no second delivery).

    The queue runs on a ManualClock that only the test moves, and the handler ends when the
    test lets it: no sleep has to be long enough on a loaded machine.
    """
    calls: list[int] = []
    started, release = threading.Event(), threading.Event()

    def slow(message: dq.Message, **kwargs: Any) -> None:
        calls.append(message.attempt)
        started.set()
        release.wait(WAIT)

    receivers(slow)
    clock = ManualClock()
    config = QueueSettings(visibility_timeout=3, max_attempts=3)
    q = Queue(redis_client, QUEUE, settings=config, clock=clock)
    worker = Worker([q], idle_seconds=0.1, maintenance_seconds=0.1)
    worker.refresh = lambda: None  # keep the settings above (no published overrides)
    message_id = q.schedule({}).id
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(WAIT)
        for _ in range(3):
            clock.advance(seconds=2)
            extended = clock.now_ms() + 3000
            deadline = time.monotonic() + WAIT
            while redis_client.zscore(KEYS.unack, message_id) != extended:
                assert time.monotonic() < deadline, "the deadline was not extended"
                time.sleep(0.02)
            assert q.reap().retried == 0
        release.set()
        deadline = time.monotonic() + WAIT
        while redis_client.hexists(KEYS.messages, message_id) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        release.set()
        worker.request_stop()
        thread.join(WAIT)
    assert calls == [1]
    assert not redis_client.hexists(KEYS.messages, message_id)  # acked


def test_the_worker_owns_its_task_side_as_a_part() -> None:
    """Before: ``Worker(TaskServing, Consumer)``, TaskServing a mixin that declared the
    worker's attributes (name, queues, the task state the worker's ``__init__`` set) and read
    them. Now the worker builds it, giving it what it needs, and keeps none of its state."""
    import ast
    import inspect

    from django_delayqueue.core.consumer.loop import Consumer
    from django_delayqueue.tasks import serving
    from django_delayqueue.tasks.serving import TaskServing

    assert Worker.__bases__ == (Consumer,)
    assert TaskServing.__bases__ == (object,)
    tree = ast.parse(inspect.getsource(serving))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TaskServing"]
    assert not [n for n in node.body if isinstance(n, ast.AnnAssign)]  # nothing borrowed
    worker = Worker.for_queues([QUEUE], worker_id="w1")
    assert isinstance(worker.tasks, TaskServing) and worker.tasks.worker_id == "w1"
    assert not {"_task_queues", "_any_queue", "_tasks", "_async_tasks"} & set(vars(worker))
