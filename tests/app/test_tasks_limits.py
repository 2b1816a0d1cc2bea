"""@task messages under their queue's time limits and aborts (issue 26): what their results say.

On the demo's task queue, with the fixtures of test_tasks_backend and test_tasks_semantics.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import test_tasks_backend as backend_tests
from core_consumer_support import Started, Ticks
from django.conf import settings
from django.test import override_settings
from test_tasks_backend import KEYS, QUEUE, tasks_on_the_demo_queue  # noqa: F401
from test_tasks_semantics import backends_follow_the_tasks_setting, queue_settings  # noqa: F401
from waiting import wait_until

import django_delayqueue as dq
from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler, settle_stopped
from django_delayqueue.core.delivery import NACK_ABORTED
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.tasks import framework
from django_delayqueue.worker import Worker

Status = framework.TaskResultStatus
STOP = "django_delayqueue.core.errors.TimeLimitExceeded"
ABORTED = "django_delayqueue.core.errors.Aborted"


def examples() -> Any:
    return backend_tests.examples


@pytest.mark.django_db(transaction=True)
def test_a_task_past_its_time_limit_is_retried_then_fails_with_the_error(
    redis_client: redis.Redis, running: Started
) -> None:
    with queue_settings(max_attempts=2, backoff_base=0, backoff_max=0, time_limit=0.3):
        result = examples().spins_until_stopped.enqueue()
        running(Worker.for_queues([QUEUE], idle_seconds=0.1))
        failed = wait_until(
            lambda: (
                (r := examples().spins_until_stopped.get_result(result.id)).status == Status.FAILED
                and r
            )
        )
    assert [e.exception_class_path for e in failed.errors] == [STOP, STOP]
    assert all("time limit exceeded (0.3 s)" in e.traceback for e in failed.errors)
    wait_until(lambda: redis_client.zscore(KEYS.garbage, result.id) is not None)
    assert redis_client.hget(KEYS.reasons, result.id).startswith(b"no attempts left")


@pytest.mark.django_db(transaction=True)
def test_an_aborted_task_that_returns_fails_and_is_dead(
    redis_client: redis.Redis, running: Started
) -> None:
    with queue_settings(max_attempts=3):
        result = examples().works_until_aborted.enqueue()
        running(Worker.for_queues([QUEUE], idle_seconds=0.1))
        wait_until(lambda: redis_client.lrange(backend_tests.examples.TRACE, 0, -1))
        assert dq.abort(QUEUE, result.id, reason="not needed").running
        failed = wait_until(
            lambda: (
                (r := examples().works_until_aborted.get_result(result.id)).status == Status.FAILED
                and r
            )
        )
    assert [e.exception_class_path for e in failed.errors] == [
        "django_delayqueue.core.errors.Aborted"
    ]
    assert "aborted: not needed" in failed.errors[0].traceback
    # The record is written at once, the message buried with the next round trip.
    wait_until(lambda: redis_client.zscore(KEYS.garbage, result.id) is not None)
    assert redis_client.hget(KEYS.reasons, result.id) == b"aborted: not needed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("time_limit", [None, 600], ids=["no-limit", "time-limited"])
def test_a_sync_task_sees_its_abort_inside_async_to_sync(
    redis_client: redis.Redis, running: Started, time_limit: float | None
) -> None:
    limit = {} if time_limit is None else {"time_limit": time_limit}
    with queue_settings(max_attempts=3, abort_grace_seconds=600, **limit):
        result = examples().works_until_aborted_seen_through_asgiref.enqueue()
        running(Worker.for_queues([QUEUE], idle_seconds=0.1))
        wait_until(lambda: redis_client.lrange(backend_tests.examples.TRACE, 0, -1))
        assert dq.abort(QUEUE, result.id, reason="not needed").running
        failed = wait_until(
            lambda: (
                (
                    r := examples().works_until_aborted_seen_through_asgiref.get_result(result.id)
                ).status
                == Status.FAILED
                and r
            )
        )
    assert [e.exception_class_path for e in failed.errors] == [
        "django_delayqueue.core.errors.Aborted"
    ]
    # Seen by the task itself (not stopped at the end of the abort's grace).
    assert redis_client.lrange(backend_tests.examples.TRACE, 0, -1)[-1] == b"saw the abort"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("attempts", "status"), [(2, Status.READY), (1, Status.FAILED)])
def test_a_stopped_task_settled_by_the_supervisor_says_so(
    redis_client: redis.Redis, attempts: int, status: Any
) -> None:
    with queue_settings(max_attempts=attempts, backoff_base=0, backoff_max=0):
        result = examples().add.enqueue(1, 2)
        queue = get_queue(QUEUE)
        (delivery,) = queue.claim(1)  # its handler blocked, its process replaced
        stopped = StoppedHandler.of(delivery, "retry", "time limit exceeded (2 s)")
        assert stopped.task
        assert settle_stopped({QUEUE: queue}, [StoppedHandler.from_json(stopped.to_json())])
        settled = examples().add.get_result(result.id)
    assert settled.status == status
    assert [e.exception_class_path for e in settled.errors] == [STOP]
    assert "time limit exceeded (2 s)" in settled.errors[0].traceback


@pytest.mark.django_db(transaction=True)
def test_a_limit_reached_after_the_task_returned_does_not_fail_it(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis, running: Started
) -> None:
    """The watchdog's soft limit coming due while the runner writes a returned task's result
    (encoding it, say) must not land there: the task returned, so it succeeded."""
    from django_delayqueue.core.consumer.limits import runs as limits
    from django_delayqueue.tasks import runner

    sent: list[bool] = []
    stored = runner._stored

    def limit_comes_due_now(value: Any) -> Any:  # as if the watchdog's thread sent it now
        run = limits.current_run()
        assert run is not None
        sent.append(run.send(dq.SoftTimeLimitExceeded, "soft time limit exceeded (1 s)"))
        return stored(value)

    monkeypatch.setattr(runner, "_stored", limit_comes_due_now)
    with queue_settings(max_attempts=2, soft_time_limit=60, time_limit=120):
        result = examples().add.enqueue(2, 3)
        running(Worker.for_queues([QUEUE], idle_seconds=0.1))
        done = wait_until(
            lambda: (
                (r := examples().add.get_result(result.id)).status
                in (framework.SUCCESSFUL, Status.FAILED)
                and r
            )
        )
    assert sent == [False]  # refused: the task had returned
    # (Its errors shown: once, under load in CI's floor-versions run, it read FAILED.)
    assert done.status == framework.SUCCESSFUL and done.return_value == 5, [
        e.traceback for e in done.errors
    ]
    wait_until(lambda: redis_client.hlen(KEYS.messages) == 0)


@pytest.mark.django_db(transaction=True)
def test_an_aborted_async_task_that_returns_fails_and_is_dead(
    redis_client: redis.Redis, running: Started
) -> None:
    with queue_settings(max_attempts=3):
        result = examples().async_works_until_aborted.enqueue()
        running(Worker.for_queues([QUEUE], idle_seconds=0.1))
        wait_until(lambda: redis_client.lrange(backend_tests.examples.TRACE, 0, -1))
        assert dq.abort(QUEUE, result.id, reason="not needed").running
        failed = wait_until(
            lambda: (
                (r := examples().async_works_until_aborted.get_result(result.id)).status
                == Status.FAILED
                and r
            )
        )
    assert [e.exception_class_path for e in failed.errors] == [
        "django_delayqueue.core.errors.Aborted"
    ]
    wait_until(lambda: redis_client.zscore(KEYS.garbage, result.id) is not None)
    # The record says it too (not RUNNING left for ever once the dead letter is purged).
    assert redis_client.hget(KEYS.task_result(result.id), "status") == b"FAILED"


# --- issue 36 §4: an abort wins over a time limit that comes in its grace -----------------------


def failed_result(task: Any, result_id: str) -> Any:
    return wait_until(lambda: (r := task.get_result(result_id)).status == Status.FAILED and r)


def traced(client: redis.Redis, what: str) -> None:
    wait_until(lambda: what.encode() in client.lrange(backend_tests.examples.TRACE, 0, -1))


@pytest.mark.django_db(transaction=True)
def test_an_aborted_task_stopped_at_its_time_limit_says_aborted(
    redis_client: redis.Redis, running: Started
) -> None:
    """Before: FAILED with TimeLimitExceeded in its errors, its message dead as aborted."""
    with (
        queue_settings(max_attempts=3, abort_grace_seconds=600),
        # (Entered after queue_settings: settings.DELAYQUEUE has its queue by then.)
        override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "SETTINGS_REFRESH_SECONDS": 0.1}),
    ):
        result = examples().ignores_its_abort.enqueue()
        running(Worker.for_queues([QUEUE], idle_seconds=0.1))
        traced(redis_client, "working")
        assert dq.abort(QUEUE, result.id, reason="not needed").running
        traced(redis_client, "saw the abort")
        # Staff set a time limit in the admin, already past: it comes in the abort's grace.
        queue_overrides.publish({QUEUE: {"time_limit": 0.5}})
        failed = failed_result(examples().ignores_its_abort, result.id)
    queue_overrides.forget()
    assert [e.exception_class_path for e in failed.errors] == [ABORTED]
    assert "aborted: not needed" in failed.errors[0].traceback
    wait_until(lambda: redis_client.zscore(KEYS.garbage, result.id) is not None)
    assert redis_client.hget(KEYS.reasons, result.id) == b"aborted: not needed"


@pytest.mark.django_db(transaction=True)
def test_an_aborted_async_task_cancelled_at_its_time_limit_says_aborted(
    redis_client: redis.Redis, running: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: FAILED with CancelledError in its errors, its message dead as aborted."""
    with queue_settings(max_attempts=3, abort_grace_seconds=600, time_limit=30):
        result = examples().async_ignores_its_abort.enqueue()
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        ticks = Ticks()  # the limits are timed on it
        monkeypatch.setattr(worker._runs, "monotonic", ticks)  # the watchdog\'s clock
        running(worker)
        traced(redis_client, "working")
        assert dq.abort(QUEUE, result.id, reason="not needed").running
        traced(redis_client, "saw the abort")
        ticks.now += 31  # its time limit comes, in the abort's grace (600 s)
        failed = failed_result(examples().async_ignores_its_abort, result.id)
    assert [e.exception_class_path for e in failed.errors] == [ABORTED]
    assert "aborted: not needed" in failed.errors[0].traceback
    wait_until(lambda: redis_client.zscore(KEYS.garbage, result.id) is not None)
    assert redis_client.hget(KEYS.reasons, result.id) == b"aborted: not needed"


# --- issue 36 §4: an abort that lands after the task ended, before its nack, wins -------------


@pytest.mark.django_db(transaction=True)
def test_a_task_aborted_after_it_failed_and_before_its_nack_says_aborted(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker is stepped by hand (no thread learns aborts): the abort lands after the task
    raised and its record said READY, before the round that nacks it. Before: dead as aborted,
    while the journal said a retry of RuntimeError, the record READY with RuntimeError."""
    with queue_settings(max_attempts=3, backoff_base=0, backoff_max=0):
        result = examples().always_fails.enqueue("x")
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        try:
            wait_until(lambda: worker.step() == 1)  # claims it; its thread runs it
            wait_until(lambda: examples().always_fails.get_result(result.id).errors)
            abort_and_step_until_buried(worker, result.id, redis_client)
        finally:
            worker._threads.close()
        failed = examples().always_fails.get_result(result.id)
    assert failed.status == Status.FAILED
    assert [e.exception_class_path for e in failed.errors] == [ABORTED]
    assert redis_client.hget(KEYS.reasons, result.id) == b"aborted: not needed"
    # Its error says the dead letter's reason, the abort's own included (issue 36 §4).
    assert failed.errors[0].traceback.endswith("Aborted: aborted: not needed\n")
    rows = [row for _, f in redis_client.xrange(KEYS.journal) for row in json.loads(f[b"o"])]
    assert [(row[0], row[5], row[6], row[7]) for row in rows] == [
        (result.id, 1, "garbage", "Aborted")
    ]
    assert "used its last attempt" not in caplog.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempts", [3, 1], ids=["retry", "last-attempt"])
def test_a_task_whose_retry_is_buried_as_aborted_at_its_nack_sends_task_finished(
    redis_client: redis.Redis, attempts: int
) -> None:
    """A task raises with attempts left (its runner records READY and sends no task_finished:
    it will run again), then its abort lands before the round that nacks it: nack.lua buries it
    as aborted and its record says FAILED, Aborted. Every other end of a task sends
    task_finished; before, this one never did. The worker is stepped by hand (no thread learns
    aborts), so the abort is learnt from the nack alone. On its last attempt the runner sent
    task_finished (FAILED, what it raised) as it ended: not a second time."""
    heard: list[tuple[Any, list[str], str, Any]] = []

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        stored = examples().always_fails.get_result(task_result.id)  # read inside, as users do
        paths = [e.exception_class_path for e in task_result.errors]
        heard.append((task_result.status, paths, task_result.errors[-1].traceback, stored.status))

    framework.task_finished.connect(finished)
    try:
        with queue_settings(max_attempts=attempts, backoff_base=0, backoff_max=0):
            result = examples().always_fails.enqueue("x")
            worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
            try:
                wait_until(lambda: worker.step() == 1)  # claims it; its thread runs it
                # Its failure recorded (and, on its last attempt, told: task_finished).
                wait_until(
                    lambda: (
                        examples().always_fails.get_result(result.id).errors
                        and (attempts > 1 or heard)
                    )
                )
                before = list(heard)
                abort_and_step_until_buried(worker, result.id, redis_client)
            finally:
                worker._threads.close()
    finally:
        framework.task_finished.disconnect(finished)
    assert len(heard) == 1  # sent once the record says so (retry), or as it ended (last)
    status, paths, traceback, stored = heard[0]
    assert status == Status.FAILED and stored == Status.FAILED
    if attempts > 1:
        assert before == []  # a retry: no task_finished as it failed
        assert paths == [ABORTED]
        assert traceback.endswith("Aborted: aborted: not needed\n")
    else:
        assert before == heard and paths == ["builtins.RuntimeError"]


@pytest.mark.django_db(transaction=True)
def test_a_stopped_task_aborted_before_the_supervisor_settles_it_says_aborted(
    redis_client: redis.Redis,
) -> None:
    """A handler its process could not stop at its time limit (settled as a retry once the
    process is gone), aborted meanwhile: nack.lua buries it as aborted. Before: FAILED with
    TimeLimitExceeded among its errors."""
    with queue_settings(max_attempts=3, backoff_base=0, backoff_max=0):
        result = examples().add.enqueue(1, 2)
        queue = get_queue(QUEUE)
        (delivery,) = queue.claim(1)
        stopped = StoppedHandler.of(delivery, "retry", "time limit exceeded (2 s)")
        assert dq.abort(QUEUE, result.id, reason="not needed").running
        assert settle_stopped({QUEUE: queue}, [stopped]) == [NACK_ABORTED]
        settled = examples().add.get_result(result.id)
    assert settled.status == Status.FAILED
    assert [e.exception_class_path for e in settled.errors] == [ABORTED]
    assert redis_client.hget(KEYS.reasons, result.id) == b"aborted: not needed"
    assert settled.errors[0].traceback.endswith("Aborted: aborted: not needed\n")


def abort_and_step_until_buried(worker: Any, message_id: str, redis_client: Any) -> None:
    """Abort the running task ``message_id`` and step ``worker`` until its nack buried it and
    every write it owed (the record's too) went."""
    assert dq.abort(QUEUE, message_id, reason="not needed").running
    wait_until(
        lambda: (
            worker.step() is not None
            and redis_client.zscore(KEYS.garbage, message_id) is not None
            and not worker._unrecorded.left()[1]  # the record's write went too
            and not worker._unrecorded
        )
    )
