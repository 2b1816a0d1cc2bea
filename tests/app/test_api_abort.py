"""dq.abort, and the time limits of a queue as a running Worker follows them (issue 26).

Workers run on threads with real Redis; every wait is an event or a poll with a generous
deadline, never a sleep that must be long enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from core_consumer_support import Ticks
from django.conf import settings
from django.test import override_settings
from waiting import TIMEOUT, wait_until

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.worker import Worker

QUEUE = "limited"
SHARDED = "limited-sharded"
TIMED = "limited-timed"  # a time limit from the start (a coroutine's is read as it starts)
KEYS = QueueKeys("dq", QUEUE)


@pytest.fixture(autouse=True)
def limited_queues() -> Iterator[None]:
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUE: {"max_attempts": 3, "backoff_base": 60, "abort_grace_seconds": 600},
        SHARDED: {"shards": 4, "abort_grace_seconds": 0.2},
        TIMED: {"max_attempts": 3, "abort_grace_seconds": 600, "time_limit": 30},
    }
    config = {**settings.DELAYQUEUE, "QUEUES": queues, "SETTINGS_REFRESH_SECONDS": 0.1}
    with override_settings(DELAYQUEUE=config):
        queue_overrides.forget()
        yield
    queue_overrides.forget()


@pytest.fixture
def receivers() -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    connected: list[tuple[str, Callable[..., Any]]] = []

    def connect(queue: str, fn: Callable[..., Any]) -> None:
        dq.topic(queue).connect(fn, weak=False)
        connected.append((queue, fn))

    yield connect
    for queue, fn in connected:
        dq.topic(queue).disconnect(fn)


@pytest.fixture
def start_worker() -> Iterator[Callable[..., Worker]]:
    started: list[tuple[Worker, threading.Thread]] = []

    def start(*names: str) -> Worker:
        worker = Worker.for_queues(list(names), idle_seconds=0.1)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.request_stop()
        thread.join(TIMEOUT)
        if thread.is_alive():
            worker.request_stop()
            thread.join(TIMEOUT)


def test_abort_of_a_message_that_is_not_running_says_so(redis_client: redis.Redis) -> None:
    dq.schedule(QUEUE, {"n": 1}, id="later", delay=3600)
    result = dq.abort(QUEUE, "later", reason="no")
    assert not result and result.state == "pending"
    assert result.message == (
        f"message 'later' of queue '{QUEUE}' is not running: it is waiting for its due time "
        "(cancel it instead)"
    )
    assert not dq.abort(QUEUE, "never-scheduled")
    assert redis_client.zscore(KEYS.pending, "later") is not None  # unchanged


@pytest.mark.django_db(transaction=True)
def test_cooperative_abort_from_the_api(
    redis_client: redis.Redis, receivers: Any, start_worker: Any
) -> None:
    started, seen = threading.Event(), []

    def long_report(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while not message.aborted:
            threading.Event().wait(0.01)
        seen.append(dq.abort_requested())
        raise RuntimeError("cleaned up and gave up")  # whatever it does: dead letters

    receivers(QUEUE, long_report)
    dq.schedule(QUEUE, {"report": 1}, id="r1")
    start_worker(QUEUE)
    assert started.wait(TIMEOUT)
    assert dq.abort(QUEUE, "r1", reason="customer cancelled").running
    wait_until(lambda: redis_client.zscore(KEYS.garbage, "r1") is not None)
    assert seen == [True]
    assert redis_client.hget(KEYS.reasons, "r1") == b"aborted: customer cancelled"
    assert redis_client.hget(KEYS.attempts, "r1") == b"1"  # never retried
    assert dq.get_queue(QUEUE).requeue("r1") == 1  # and requeued like any dead letter


async def _abort_requested() -> bool:
    return dq.abort_requested()


@pytest.mark.django_db(transaction=True)
def test_a_sync_handler_sees_its_abort_inside_async_to_sync(
    redis_client: redis.Redis, receivers: Any, start_worker: Any
) -> None:
    started, seen = threading.Event(), []

    def long_report(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while not async_to_sync(_abort_requested)():  # another thread, this context copied
            threading.Event().wait(0.01)
        seen.append(message.aborted)
        raise RuntimeError("cleaned up and gave up")

    receivers(QUEUE, long_report)
    dq.schedule(QUEUE, {"report": 1}, id="r2")
    start_worker(QUEUE)
    assert started.wait(TIMEOUT)
    assert dq.abort(QUEUE, "r2", reason="customer cancelled").running
    wait_until(lambda: redis_client.zscore(KEYS.garbage, "r2") is not None)
    assert seen == [True]  # seen by the handler (its queue's grace is 600 s)


@pytest.mark.django_db(transaction=True)
def test_forced_abort_finds_the_shard(
    redis_client: redis.Redis, receivers: Any, start_worker: Any
) -> None:
    started = threading.Event()

    def ignores_it(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while True:
            try:
                while True:
                    pass
            except Exception:  # swallows everything it can
                continue

    receivers(SHARDED, ignores_it)
    dq.schedule(SHARDED, {}, id="s-7")
    start_worker(SHARDED)
    assert started.wait(TIMEOUT)
    assert dq.abort(SHARDED, "s-7").running
    shard_keys = dq.get_queue(SHARDED).keys_for("s-7")
    wait_until(lambda: redis_client.zscore(shard_keys.garbage, "s-7") is not None)
    assert redis_client.hget(shard_keys.reasons, "s-7") == b"aborted"


@pytest.mark.django_db(transaction=True)
def test_a_time_limit_edited_in_the_admin_reaches_a_running_worker(
    redis_client: redis.Redis, receivers: Any, start_worker: Any
) -> None:
    from django_delayqueue.models import QueueConfig

    started = threading.Event()

    def spins(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while True:
            try:
                while True:
                    pass
            except Exception:  # the soft limit, caught: only the hard one ends it
                pass

    receivers(QUEUE, spins)
    worker = start_worker(QUEUE)
    dq.schedule(QUEUE, {}, id="t1")
    assert started.wait(TIMEOUT)
    assert worker.queues[0].settings.time_limit is None  # it runs unbounded
    row = QueueConfig.objects.get(name=QUEUE)
    row.soft_time_limit, row.time_limit = 0.2, 0.5
    row.full_clean()
    row.save()  # published on commit; the worker follows at its next settings refresh
    wait_until(lambda: redis_client.zscore(KEYS.retry, "t1") is not None)
    assert redis_client.hget(KEYS.reasons, "t1") == b"time limit exceeded (0.5 s)"
    assert worker.queues[0].settings.time_limit == 0.5


# --- issue 36 §4: an abort wins over a time limit that comes in its grace -----------------------


def journal_rows(client: redis.Redis, keys: QueueKeys) -> list[tuple[int, str, str]]:
    """(attempt, status, error) of each journal row."""
    rows = [row for _, f in client.xrange(keys.journal) for row in json.loads(f[b"o"])]
    return [(row[5], row[6], row[7]) for row in rows]


def the_story(
    client: redis.Redis, keys: QueueKeys, message_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal, the dead letters and the log lines all tell of the abort."""
    wait_until(lambda: client.zscore(keys.garbage, message_id) and journal_rows(client, keys))
    assert client.hget(keys.reasons, message_id) == b"aborted: customer cancelled"
    assert journal_rows(client, keys) == [(1, "garbage", "Aborted")]
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert f"message {message_id} aborted (customer cancelled) and at its time limit" in log
    assert "time limit exceeded" not in log and "used its last attempt" not in log


@pytest.mark.django_db(transaction=True)
def test_a_receiver_at_its_time_limit_in_an_aborts_grace_is_stopped_as_aborted(
    redis_client: redis.Redis,
    receivers: Any,
    start_worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started, saw_abort, ended_by = threading.Event(), threading.Event(), []

    def ignores_its_abort(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while not message.aborted:
            threading.Event().wait(0.01)
        saw_abort.set()
        try:
            while True:
                try:
                    while True:
                        pass
                except Exception:
                    pass
        except BaseException as e:
            ended_by.append(type(e).__name__)
            raise

    receivers(QUEUE, ignores_its_abort)
    dq.schedule(QUEUE, {"report": 1}, id="r3")
    start_worker(QUEUE)
    assert started.wait(TIMEOUT)
    assert dq.abort(QUEUE, "r3", reason="customer cancelled").running
    assert saw_abort.wait(TIMEOUT)
    # Staff set a time limit in the admin, already past: it comes in the abort's grace (600 s).
    queue_overrides.publish({QUEUE: {"time_limit": 0.5}})
    the_story(redis_client, KEYS, "r3", caplog)
    assert ended_by == ["Aborted"]


@pytest.mark.django_db(transaction=True)
def test_an_async_receiver_at_its_time_limit_in_an_aborts_grace_ends_as_aborted(
    redis_client: redis.Redis,
    receivers: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, saw_abort = threading.Event(), threading.Event()

    async def ignores_its_abort(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while not message.aborted:
            await asyncio.sleep(0.01)
        saw_abort.set()
        while True:
            with contextlib.suppress(Exception):
                await asyncio.sleep(3600)

    receivers(TIMED, ignores_its_abort)
    dq.schedule(TIMED, {"report": 1}, id="r4")
    worker = Worker.for_queues([TIMED], idle_seconds=0.1)
    ticks = Ticks()  # the limits are timed on it
    monkeypatch.setattr(worker._runs, "monotonic", ticks)  # the watchdog\'s clock
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(TIMEOUT)
        assert dq.abort(TIMED, "r4", reason="customer cancelled").running
        assert saw_abort.wait(TIMEOUT)
        ticks.now += 31  # its time limit (30 s) comes, in the abort's grace (600 s)
        the_story(redis_client, QueueKeys("dq", TIMED), "r4", caplog)
    finally:
        worker.request_stop()
        thread.join(TIMEOUT)
        if thread.is_alive():
            worker.request_stop()  # the second stops at once
            thread.join(TIMEOUT)
