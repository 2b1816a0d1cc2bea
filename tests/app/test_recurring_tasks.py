"""A Django ``@task`` made periodic with ``@periodic``: runqueue runs it once per tick, and its
result is readable under the tick's id."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from core_consumer_support import Started
from django.conf import settings
from django.test import override_settings
from waiting import wait_until

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.recurring import parse_tick_id
from django_delayqueue.models import RecurringSchedule
from django_delayqueue.tasks import framework
from django_delayqueue.tasks.periodic import periodic, registered, unregister
from django_delayqueue.worker import Worker

QUEUE = "shop-tasks"


@pytest.fixture
def tasks_on() -> Iterator[Any]:
    from tests.settings import TASKS_SETTING

    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"max_attempts": 2, "backoff_base": 0}}
    delayqueue = {**settings.DELAYQUEUE, "QUEUES": queues, "SETTINGS_REFRESH_SECONDS": 0.2}
    with override_settings(DELAYQUEUE=delayqueue, TASKS=TASKS_SETTING):
        import periodic_examples

        if "periodic_examples.beat" not in registered():  # unregistered by an earlier test
            importlib.reload(periodic_examples)
        yield periodic_examples
    unregister("periodic_examples.beat")


@pytest.mark.django_db(transaction=True)
def test_a_periodic_task_runs_once_per_tick_with_its_result_kept(
    tasks_on: Any, redis_client: redis.Redis, running: Started
) -> None:
    worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
    worker.sync_settings()  # what runqueue does first: the row comes from @periodic
    row = RecurringSchedule.objects.get(name="periodic_examples.beat")
    assert (row.queue, row.every, row.task, row.kwargs) == (
        QUEUE,
        1,
        "periodic_examples.beat",
        {"kind": "beat"},
    )
    running(worker)
    wait_until(lambda: redis_client.llen(tasks_on.TRACE) >= 2)
    tick = wait_until(
        lambda: next(
            (
                k.decode().rsplit(":task:", 1)[1]
                for k in redis_client.scan_iter("{dq:shop-tasks}:task:*")
                if tasks_on.beat.get_result(k.decode().rsplit(":task:", 1)[1]).status
                == framework.SUCCESSFUL
            ),
            None,
        )
    )
    assert parse_tick_id(tick) is not None and tick.startswith("periodic_examples.beat@")
    result = tasks_on.beat.get_result(tick)
    assert result.return_value == "beat done" and result.kwargs == {"kind": "beat"}


def test_periodic_refuses_what_cannot_run(tasks_on: Any) -> None:
    with pytest.raises(ConfigurationError, match="bad cron expression"):
        periodic(cron="every day")(tasks_on.beat)
    with pytest.raises(TypeError, match="above @task"):
        periodic(every=5)(lambda: None)
    assert "periodic_examples.beat" in registered()


def test_no_tasks_module_is_imported_without_a_backend_of_this_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Django 6 gives every project a default TASKS (the immediate backend): its tasks modules
    are not ours to import (the demo's would not even import under it)."""
    import django.utils.module_loading

    imported: list[str] = []
    monkeypatch.setattr(django.utils.module_loading, "autodiscover_modules", imported.append)
    from django_delayqueue.tasks.periodic import discover

    immediate = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    with override_settings(TASKS=immediate):
        discover()
    assert imported == []
    from tests.settings import TASKS_SETTING

    with override_settings(TASKS=TASKS_SETTING):
        discover()
    assert imported == ["tasks"]


# --- the checks: a task where a signal handler would get it, and the reverse ----------------------


def _schedule_errors(schedules: dict[str, Any], tasks: dict[str, Any]) -> list[Any]:
    from django_delayqueue.checks.recurrences import check_schedules

    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"max_attempts": 2}}
    delayqueue = {**settings.DELAYQUEUE, "QUEUES": queues, "SCHEDULES": schedules}
    with override_settings(DELAYQUEUE=delayqueue, TASKS=tasks):
        return check_schedules()


def test_a_task_schedule_on_a_queue_its_backend_does_not_list_is_refused() -> None:
    """Before: E009 passed, and each tick went to order-close's receivers as a payload."""
    from tests.settings import TASKS_SETTING

    errors = _schedule_errors(
        {"nightly": {"queue": "order-close", "every": 60, "task": "periodic_examples.beat"}},
        TASKS_SETTING,
    )
    assert [e.id for e in errors] == ["delayqueue.E009"]
    assert "task 'periodic_examples.beat' on queue 'order-close'" in errors[0].msg
    assert "TASKS['default'] does not list" in errors[0].msg
    assert "Add 'order-close' to TASKS['default']['QUEUES']" in errors[0].hint
    errors = _schedule_errors(  # a backend alias that is no backend of this app
        {"nightly": {"queue": QUEUE, "every": 60, "task": "a.b", "backend": "other"}},
        TASKS_SETTING,
    )
    assert [e.id for e in errors] == ["delayqueue.E009"]
    assert "TASKS['other'] does not list" in errors[0].msg


def test_a_payload_schedule_on_a_task_queue_without_handlers_is_refused() -> None:
    """Before: every tick was dead-lettered as "no handler"."""
    from tests.settings import TASKS_SETTING

    errors = _schedule_errors({"ping": {"queue": QUEUE, "every": 60}}, TASKS_SETTING)
    assert [e.id for e in errors] == ["delayqueue.E009"]
    assert "a payload on queue 'shop-tasks', a queue of a TASKS backend" in errors[0].msg
    assert '"task"' in errors[0].hint and "dq.topic('shop-tasks')" in errors[0].hint


def test_schedules_that_run_as_they_say_pass_the_checks() -> None:
    from tests.settings import TASKS_SETTING

    fine = {
        "task": {"queue": QUEUE, "every": 60, "task": "periodic_examples.beat"},
        "payload": {"queue": "order-close", "every": 60, "payload": {"order_id": 1}},
    }
    assert _schedule_errors(fine, TASKS_SETTING) == []
    any_queue = {"default": {**TASKS_SETTING["default"], "QUEUES": []}}
    anywhere = {"task": {"queue": "anywhere", "every": 60, "task": "periodic_examples.beat"}}
    assert _schedule_errors(anywhere, any_queue) == []  # any queue takes tasks: Django's []


@pytest.mark.django_db
def test_a_schedule_row_with_a_task_where_no_backend_runs_it_is_a_warning() -> None:
    """The same of a row added in the admin: W005, with the database checks."""
    from django_delayqueue.checks.recurrences import check_schedule_rows
    from tests.settings import TASKS_SETTING

    RecurringSchedule.objects.create(
        name="by-staff", queue="order-close", every=60, task="periodic_examples.beat"
    )
    with override_settings(TASKS=TASKS_SETTING):
        warnings = check_schedule_rows(databases=["default"])
    assert [w.id for w in warnings] == ["delayqueue.W005"]
    assert "task 'periodic_examples.beat' on queue 'order-close'" in warnings[0].msg


@pytest.mark.django_db
def test_a_schedule_row_with_a_task_on_a_queue_only_a_backend_taking_any_queue_runs_is_fine() -> (
    None
):
    """As E009 for the settings file: with ``"QUEUES": []`` runqueue keeps the row's schedule
    on a queue DELAYQUEUE does not configure (it registers that queue), so no W005."""
    from django_delayqueue.checks.recurrences import check_schedule_rows
    from tests.settings import TASKS_SETTING

    any_queue = {"default": {**TASKS_SETTING["default"], "QUEUES": []}}
    RecurringSchedule.objects.create(
        name="by-staff", queue="tick-lane", every=60, task="task_examples.add", args=[1, 2]
    )
    with override_settings(TASKS=any_queue):
        assert check_schedule_rows(databases=["default"]) == []
