"""What Django documents of a Tasks backend, on the edges the main tests do not reach.

Errors as Django raises them (a non-JSON argument is a ``TypeError``; an unknown id is
``TaskResultDoesNotExist`` from async code too), a backend subclass at another import path, a
task that cannot be imported, a task dead-lettered by the consumer, the backend's own check,
and a RUNNING result visible as soon as the task starts. On the demo's task queue, with the
fixture of test_tasks_backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

import pytest
import redis
import test_tasks_backend as backend_tests
from core_consumer_support import Started
from django.conf import settings
from django.test import override_settings
from test_tasks_backend import KEYS, QUEUE, burst, tasks_on_the_demo_queue  # noqa: F401
from waiting import wait_until

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.errors import PayloadError
from django_delayqueue.tasks import framework
from django_delayqueue.tasks.payload import TaskRecord, task_payload
from django_delayqueue.worker import Worker

Status = framework.TaskResultStatus


def examples() -> Any:
    return backend_tests.examples  # tests/task_examples.py, once the fixture imported it


@pytest.fixture(autouse=True)
def backends_follow_the_tasks_setting(request: pytest.FixtureRequest) -> Iterator[None]:
    """Django and django-tasks 0.9+ forget their backends when TASKS changes; 0.8 kept them.
    Inside the demo's TASKS: what a test changes is undone before the demo's is."""
    request.getfixturevalue("tasks_on_the_demo_queue")
    from asgiref.local import Local
    from django.core.signals import setting_changed

    def forget(*, setting: str, **kwargs: Any) -> None:
        if setting == "TASKS":
            handler = framework.task_backends
            handler._settings = handler.settings = handler.configure_settings(None)
            handler._connections = Local()

    setting_changed.connect(forget)
    yield
    setting_changed.disconnect(forget)


def demo_backend(**changes: Any) -> dict[str, Any]:
    from tests.settings import TASKS_SETTING

    return {"default": {**TASKS_SETTING["default"], **changes}}


def queue_settings(**values: Any) -> Any:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: values}
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues})


# --- arguments and unknown ids, as Django raises them ----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_argument_that_is_not_json_is_a_type_error(redis_client: redis.Redis) -> None:
    """Django documents TypeError (its own backends: "Unsupported type: ...")."""
    with pytest.raises(TypeError) as caught:
        examples().add.enqueue(datetime.now(dt_timezone.utc), 1)
    # django-tasks up to 0.8 refuses it itself, in Task.enqueue, before any backend sees it.
    if not backend_tests._backport_normalises_arguments():
        assert isinstance(caught.value, PayloadError)  # what this app raised before, still
        assert "task_examples.add: argument 1" in str(caught.value)
        if framework.normalize_json is not None:  # Django 6, django-tasks 0.9+: their words
            assert "Unsupported type" in str(caught.value)
    with pytest.raises(TypeError):
        asyncio.run(examples().add.aenqueue(1, object()))
    assert redis_client.keys("dq*shop-tasks*") == []  # nothing was written


@pytest.mark.django_db(transaction=True)
def test_an_unknown_id_does_not_exist_from_async_code_either(redis_client: redis.Redis) -> None:
    """The outbox is read through the ORM, which refuses to run on an event loop's thread."""

    async def from_async_code() -> list[str]:
        found = []
        for read in (
            lambda: examples().add.get_result("no-such-id"),
            lambda: framework.task_backends["default"].get_result("no-such-id"),
        ):
            try:
                read()
            except Exception as e:
                found.append(type(e).__name__)
        for aread in (examples().add.aget_result, framework.task_backends["default"].aget_result):
            try:
                await aread("no-such-id")
            except Exception as e:
                found.append(type(e).__name__)
        return found

    expected = framework.TaskResultDoesNotExist.__name__
    assert asyncio.run(from_async_code()) == [expected] * 4


@pytest.mark.django_db(transaction=True)
def test_from_async_code_a_task_waiting_in_the_outbox_is_found(redis_client: redis.Redis) -> None:
    from django_delayqueue.models import OutboxMessage

    # What a commit while Redis was down leaves: the row, nothing in Redis yet.
    record = TaskRecord(examples().add.module_path, QUEUE, 0, "default", [1, 2], {})
    OutboxMessage.objects.create(
        message_id="waiting-1",
        queue=QUEUE,
        due_ms=0,
        envelope="0,0,{}",
        mode=OutboxMessage.TASK,
        record=record.enqueued_json(),
    )

    async def read() -> Any:
        return examples().add.get_result("waiting-1")

    assert asyncio.run(read()).status == Status.READY


# --- a backend subclass ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_subclass_of_the_backend_elsewhere_has_its_tasks_run(redis_client: redis.Redis) -> None:
    with override_settings(TASKS=demo_backend(BACKEND="task_examples.SubclassedBackend")):
        backend = framework.task_backends["default"]
        assert type(backend).__name__ == "SubclassedBackend"
        result = examples().add.enqueue(3, 4)
        burst()
        done = examples().add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 7
    assert redis_client.zcard(KEYS.garbage) == 0


# --- a task that cannot be imported ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_task_that_cannot_be_imported_finishes_with_the_backends_ttl(
    redis_client: redis.Redis,
) -> None:
    finished: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append((sender, task_result.id, str(task_result.status), task_result.errors))

    queue = get_queue(QUEUE)
    path = "task_examples.not_deployed_yet"
    prepared = queue.prepare(task_payload(path, [], {}, "default"), id="early")
    enqueued = TaskRecord(path, QUEUE, 0, "default", [], {}, enqueued_at=prepared.due_ms)
    queue.send_with_record(prepared, KEYS.task_result("early"), enqueued.enqueued_json())
    options = {"ON_COMMIT": True, "RESULT_TTL": 900}  # not the default: what the record gets
    framework.task_finished.connect(receiver)
    try:
        with override_settings(TASKS=demo_backend(OPTIONS=options)):
            burst()
            backend = type(framework.task_backends["default"])
    finally:
        framework.task_finished.disconnect(receiver)
    assert 0 < redis_client.ttl(KEYS.task_result("early")) <= 900
    assert [(sender, id_, status) for sender, id_, status, _ in finished] == [
        (backend, "early", str(Status.FAILED))
    ]
    errors = finished[0][3]
    assert len(errors) == 3 and "not_deployed_yet" in errors[-1].traceback


@pytest.mark.django_db(transaction=True)
def test_a_task_of_an_unknown_backend_finishes_with_the_ttl_of_the_backend_of_its_queue(
    redis_client: redis.Redis,
) -> None:
    """Its TASKS alias is gone from this worker's settings: as a task that cannot be
    imported, it fails, and its end is told by the backend that takes its queue."""
    finished: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append((sender, task_result.id, str(task_result.status), task_result.errors))

    queue = get_queue(QUEUE)
    path = "task_examples.add"
    prepared = queue.prepare(task_payload(path, [1, 2], {}, "gone"), id="orphan", task=True)
    enqueued = TaskRecord(path, QUEUE, 0, "gone", [1, 2], {}, enqueued_at=prepared.due_ms)
    queue.send_with_record(prepared, KEYS.task_result("orphan"), enqueued.enqueued_json())
    options = {"ON_COMMIT": True, "RESULT_TTL": 900}
    framework.task_finished.connect(receiver)
    try:
        with override_settings(TASKS=demo_backend(OPTIONS=options)):
            burst()
            backend = type(framework.task_backends["default"])
    finally:
        framework.task_finished.disconnect(receiver)
    assert redis_client.lrange(examples().TRACE, 0, -1) == []  # never run
    assert 0 < redis_client.ttl(KEYS.task_result("orphan")) <= 900
    assert [(sender, id_, status) for sender, id_, status, _ in finished] == [
        (backend, "orphan", str(Status.FAILED))
    ]
    assert "gone" in finished[0][3][-1].traceback


@pytest.mark.django_db(transaction=True)
def test_a_redis_blip_before_a_task_starts_does_not_use_up_its_last_attempt(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a later attempt the runner reads the task's record first (its history): Redis
    failing that read must not fail the task unstarted; it runs."""
    import redis as redis_py

    from django_delayqueue.tasks.runner import TaskRunner

    with queue_settings(max_attempts=2):
        sent = examples().add.enqueue(1, 2)
        queue = get_queue(QUEUE)
        message = dataclasses.replace(queue.claim(1)[0], attempt=2)  # its last attempt

        def blip(*args: Any, **kwargs: Any) -> Any:
            raise redis_py.ConnectionError("Connection reset by peer")

        monkeypatch.setattr(queue.client, "hgetall", blip)
        TaskRunner("blipped").run(message, queue).call.run(queue.client)
        monkeypatch.undo()
        assert redis_client.lrange(examples().TRACE, 0, -1) == [b"add 1 2"]  # it ran
        assert examples().add.get_result(sent.id).status == framework.SUCCESSFUL


# --- dead-lettered by the consumer -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_task_reaped_on_its_last_attempt_says_why_in_its_errors(
    redis_client: redis.Redis,
) -> None:
    with queue_settings(max_attempts=1, visibility_timeout=1):
        result = examples().add.enqueue(1, 1)
        queue = get_queue(QUEUE)
        assert len(queue.claim(1)) == 1  # a consumer claims it, then dies
        assert queue.reap(now_ms=queue.clock.now_ms() + 60_000).buried == 1
        failed = examples().add.get_result(result.id)
    assert failed.status == Status.FAILED
    assert len(failed.errors) == 1
    error = failed.errors[0]
    assert "visibility timeout passed on the last attempt" in error.traceback
    assert issubclass(error.exception_class, Exception)
    assert failed.finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_task_given_back_at_a_stop_on_its_last_attempt_says_why(
    redis_client: redis.Redis,
) -> None:
    with queue_settings(max_attempts=1):
        result = examples().add.enqueue(2, 2)
        queue = get_queue(QUEUE)
        (delivery,) = queue.claim(1)
        # What Consumer._give_back does with a handler still running at the end of a stop.
        reason = "consumer stopped before the handler finished"
        assert queue.nack_many([(delivery, 0.0, reason)]) == [2]
        failed = examples().add.get_result(result.id)
    assert failed.status == Status.FAILED
    assert [reason in e.traceback for e in failed.errors] == [True]


@pytest.mark.django_db(transaction=True)
def test_a_failed_task_lists_its_own_errors_not_its_dead_letter_reason_again(
    redis_client: redis.Redis,
) -> None:
    result = examples().always_fails.enqueue("once")
    burst()
    failed = examples().always_fails.get_result(result.id)
    assert failed.status == Status.FAILED and len(failed.errors) == 3
    assert all(e.exception_class_path == "builtins.RuntimeError" for e in failed.errors)


# --- the backend's check ---------------------------------------------------------------------


def test_check_reports_the_app_missing_from_installed_apps() -> None:
    from django_delayqueue.tasks.backend import DelayQueueBackend

    backend = DelayQueueBackend("default", demo_backend()["default"])
    assert [e.id for e in backend.check()] == []
    without = [app for app in settings.INSTALLED_APPS if app != "django_delayqueue"]
    with override_settings(INSTALLED_APPS=without):
        errors = list(backend.check())
    assert [e.id for e in errors] == ["delayqueue.E012"]
    assert "'django_delayqueue'" in errors[0].msg and "INSTALLED_APPS" in errors[0].hint


# --- RUNNING as soon as it runs --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_running_task_reads_running_with_its_start_while_it_runs(
    redis_client: redis.Redis, running: Started
) -> None:
    """Not at the worker's next refresh or poll: this worker has neither for an hour."""
    result = examples().waits_for_release.enqueue("test:release")
    worker = Worker.for_queues(
        [QUEUE], name="quick-worker", idle_seconds=3600, maintenance_seconds=3600
    )
    worker.announce_within_ms = 3_600_000
    running(worker)
    try:
        seen = wait_until(
            lambda: (r := examples().waits_for_release.get_result(result.id)).worker_ids and r
        )
    finally:
        redis_client.rpush("test:release", "go")
    assert seen.status == Status.RUNNING
    assert seen.worker_ids == ["quick-worker"]
    assert seen.started_at is not None and seen.last_attempted_at == seen.started_at
    wait_until(
        lambda: examples().waits_for_release.get_result(result.id).status == framework.SUCCESSFUL
    )


# --- "QUEUES": [] takes any queue name ----------------------------------------------------------


@pytest.fixture
def any_queue() -> Iterator[None]:
    """The demo backend with ``"QUEUES": []``; "slow-lane" configured, "default" not."""
    queues = {**settings.DELAYQUEUE["QUEUES"], "slow-lane": {"max_attempts": 1}}
    delayqueue = {
        **settings.DELAYQUEUE,
        "QUEUES": queues,
        "DEFAULTS": {"max_attempts": 2, "backoff_base": 0},
        "SETTINGS_REFRESH_SECONDS": 0.2,
    }
    with override_settings(DELAYQUEUE=delayqueue, TASKS=demo_backend(QUEUES=[])):
        yield


@pytest.mark.django_db(transaction=True)
def test_with_no_queues_listed_any_queue_takes_tasks_and_runqueue_runs_them(
    any_queue: None, redis_client: redis.Redis
) -> None:
    finished: list[str] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(str(task_result.status))

    on_default = examples().add.using(queue_name="default")  # Django's default queue_name
    framework.task_finished.connect(receiver)
    try:
        result = on_default.enqueue(20, 22)
        assert result.task.queue_name == "default"
        Worker.for_queues(burst=True).run()  # runqueue --burst, no queue named
    finally:
        framework.task_finished.disconnect(receiver)
    done = on_default.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == 42
    assert finished == [str(framework.SUCCESSFUL)]
    assert redis_client.smembers("{dq}:task-queues") == {b"default"}


@pytest.mark.django_db(transaction=True)
def test_with_no_queues_listed_a_queue_gets_its_settings_or_the_defaults(
    any_queue: None, redis_client: redis.Redis
) -> None:
    configured = examples().always_fails.using(queue_name="slow-lane").enqueue("a")
    unlisted = examples().always_fails.using(queue_name="anything-else").enqueue("b")
    Worker.for_queues(burst=True).run()
    assert len(examples().always_fails.get_result(configured.id).errors) == 1  # its own: 1
    assert len(examples().always_fails.get_result(unlisted.id).errors) == 2  # the DEFAULTS: 2


@pytest.mark.django_db(transaction=True)
def test_runqueue_finds_a_queue_tasks_are_sent_to_while_it_runs(
    any_queue: None, redis_client: redis.Redis, running: Started
) -> None:
    running(Worker.for_queues(name="discovering"))
    result = examples().add.using(queue_name="new-lane").enqueue(1, 2)
    wait_until(lambda: examples().add.get_result(result.id).status == framework.SUCCESSFUL)
    assert examples().add.get_result(result.id).worker_ids == ["discovering"]


@pytest.mark.django_db(transaction=True)
def test_with_no_queues_listed_a_signal_queue_still_never_runs_a_task_shaped_payload(
    any_queue: None, redis_client: redis.Redis
) -> None:
    import django_delayqueue as dq

    seen: list[Any] = []

    def receiver(sender: str, message: Any, **kwargs: Any) -> None:
        seen.append(message.payload)

    dq.topic("order-close").connect(receiver, weak=False)
    try:
        dq.schedule("order-close", {"django.task": "task_examples.add", "args": [40, 2]})
        Worker.for_queues(burst=True).run()
    finally:
        dq.topic("order-close").disconnect(receiver)
    assert redis_client.lrange(examples().TRACE, 0, -1) == []  # not imported, not run
    assert seen and seen[0]["django.task"] == "task_examples.add"


@pytest.mark.django_db(transaction=True)
def test_a_signal_queue_a_task_was_sent_to_still_never_runs_a_task_shaped_payload(
    any_queue: None, redis_client: redis.Redis
) -> None:
    """A task sent to a signal queue (by mistake) puts it in the registry of task queues; a
    payload given to ``dq.schedule`` there is still a signal message, whatever keys it has:
    only the backend's enqueue marks a task."""
    import django_delayqueue as dq

    seen: list[Any] = []

    def receiver(sender: str, message: Any, **kwargs: Any) -> None:
        seen.append(message.payload)

    dq.topic("order-close").connect(receiver, weak=False)
    try:
        sent = examples().add.using(queue_name="order-close").enqueue(5, 6)
        assert redis_client.sismember("{dq}:task-queues", "order-close")
        dq.schedule("order-close", {"django.task": "task_examples.add", "args": [1, 2]})
        Worker.for_queues(["order-close"], burst=True).run()
    finally:
        dq.topic("order-close").disconnect(receiver)
    assert redis_client.lrange(examples().TRACE, 0, -1) == [b"add 5 6"]  # the task alone ran
    assert examples().add.get_result(sent.id).status == framework.SUCCESSFUL
    # Delivered to the receivers (the demo's own raises KeyError on it: retried, never run).
    assert seen and all(p == {"django.task": "task_examples.add", "args": [1, 2]} for p in seen)


@pytest.mark.django_db(transaction=True)
def test_a_task_enqueued_without_the_mark_by_an_earlier_version_still_runs(
    any_queue: None, redis_client: redis.Redis
) -> None:
    """Tasks waiting in Redis across the upgrade have no task mark in their envelope: on a
    task queue no signal receiver listens to, they run as before."""
    queue = get_queue("default", task=True)
    payload = task_payload("task_examples.add", [3, 4], {}, "default")
    queue.schedule(payload)  # the envelope an earlier version wrote: no mark
    redis_client.sadd("{dq}:task-queues", "default")
    Worker.for_queues(["default"], burst=True).run()
    assert redis_client.lrange(examples().TRACE, 0, -1) == [b"add 3 4"]


def test_with_no_queues_listed_a_queue_name_redis_cannot_hold_is_refused(any_queue: None) -> None:
    with pytest.raises(framework.InvalidTask, match="invalid queue name"):
        examples().add.using(queue_name="no spaces {allowed}")


@pytest.mark.django_db(transaction=True)
def test_with_no_queues_listed_a_task_schedule_runs_on_a_queue_nobody_configured(
    any_queue: None, redis_client: redis.Redis, running: Started
) -> None:
    schedule = {"queue": "tick-lane", "every": 1, "task": "task_examples.add", "args": [1, 2]}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "SCHEDULES": {"sum": schedule}}):
        from django_delayqueue.checks.recurrences import check_schedules

        assert check_schedules() == []
        worker = Worker.for_queues(name="ticking")
        worker.sync_settings()
        running(worker)
        wait_until(lambda: redis_client.lrange(examples().TRACE, 0, -1))
    assert redis_client.lrange(examples().TRACE, 0, 0) == [b"add 1 2"]  # run as a task


def test_with_no_queues_listed_a_configured_queue_without_handler_is_no_warning(
    any_queue: None,
) -> None:
    """Any queue may be a task queue then: "slow-lane" needs no signal handler."""
    from django_delayqueue.checks import check_handlers

    assert [w.id for w in check_handlers()] == []
