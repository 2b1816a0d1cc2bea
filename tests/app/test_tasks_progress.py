"""A task's progress (issue 28): reported inside the task (django_delayqueue.tasks.progress,
dq.progress), read beside its result (the backend's get_progress, tasks.progress_of) while it
runs, gone once it finished.

On the demo's task queue, with the fixtures of test_tasks_backend.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import test_tasks_backend as backend_tests
from core_consumer_support import Started
from test_tasks_backend import KEYS, QUEUE, tasks_on_the_demo_queue  # noqa: F401
from waiting import wait_until

from django_delayqueue.tasks import framework, progress_of
from django_delayqueue.worker import Worker

Status = framework.TaskResultStatus
# SUCCEEDED up to django-tasks 0.11, SUCCESSFUL from 0.12 and in Django 6 (framework.py).
SUCCESSFUL = framework.SUCCESSFUL


def _finished(task: Any, result_id: str) -> Any:
    return wait_until(
        lambda: (r := task.get_result(result_id)).status == framework.SUCCESSFUL and r
    )


@pytest.mark.django_db(transaction=True)
def test_a_running_task_s_progress_is_read_beside_its_result_and_ends_with_it(
    redis_client: redis.Redis, running: Started
) -> None:
    examples = backend_tests.examples
    task = examples.reports_progress
    result = task.enqueue(steps=500)
    backend = framework.task_backends[result.backend]
    assert backend.get_progress(result.id) is None  # not started
    running(Worker.for_queues([QUEUE], idle_seconds=0.1))
    wait_until(lambda: redis_client.lrange(examples.TRACE, 0, -1))
    reported = wait_until(lambda: backend.get_progress(result.id))
    assert (reported.percent, reported.note) == (50.0, "halfway, attempt 1")
    running_result = task.get_result(result.id)
    assert running_result.status == Status.RUNNING
    assert progress_of(running_result) == reported
    redis_client.rpush(examples.PROGRESS_GATE, "go")
    finished = _finished(task, result.id)
    assert finished.return_value == 500
    wait_until(lambda: redis_client.zscore(KEYS.unack, result.id) is None)
    assert backend.get_progress(result.id) is None and progress_of(finished) is None
    assert redis_client.exists(KEYS.progress) == 0


@pytest.mark.django_db(transaction=True)
def test_an_async_task_reports_its_progress(redis_client: redis.Redis, running: Started) -> None:
    examples = backend_tests.examples
    task = examples.async_reports_progress
    result = task.enqueue()
    running(Worker.for_queues([QUEUE], idle_seconds=0.1))
    reported = wait_until(lambda: progress_of(task.get_result(result.id)))
    assert (reported.percent, reported.note) == (25.5, "async quarter")
    redis_client.rpush(examples.PROGRESS_GATE, "go")
    assert _finished(task, result.id).return_value == "done"


def test_progress_of_an_unknown_task_is_none() -> None:
    backend = framework.task_backends["default"]
    assert backend.get_progress("no-such-task") is None
