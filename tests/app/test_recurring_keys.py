"""A recurring schedule's flow key through Django: ``DELAYQUEUE["SCHEDULES"]`` and the admin's
rows carry ``key`` to every tick, a ``task`` schedule's ticks take the task's key argument, and
the checks and the admin refuse a keyed schedule a sharded queue cannot keep."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from core_consumer_support import Started
from django.conf import settings
from django.test import override_settings
from waiting import wait_until

from django_delayqueue.checks.recurrences import check_schedules
from django_delayqueue.core import QueueKeys
from django_delayqueue.core.recurring import Recurrence
from django_delayqueue.core.sharding import key_shard, shard_index
from django_delayqueue.mirror.recurrences import load_published
from django_delayqueue.models import RecurringSchedule
from django_delayqueue.worker import Worker, tick_key

QUEUE, SHARDED = "reports", "reports-sharded"
KEYS = QueueKeys("dq", QUEUE)
ADMIN = "/admin/django_delayqueue/recurringschedule/"


def configure(schedules: dict[str, Any], **extra: Any) -> Any:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {}, SHARDED: {"shards": 4}}
    return override_settings(
        DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues, "SCHEDULES": schedules, **extra}
    )


def flow_keys(client: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(KEYS.flow_keys).items()}


@pytest.mark.django_db(transaction=True)
def test_a_keyed_schedule_in_the_settings_reaches_its_ticks(
    redis_client: redis.Redis, running: Started
) -> None:
    schedule = {"queue": QUEUE, "every": 3600, "payload": {"store": 7}, "key": "store-7"}
    with configure({"sync-7": schedule, "digest": {"queue": QUEUE, "every": 3600}}):
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        worker.sync_settings()  # what runqueue does first
        assert RecurringSchedule.objects.get(name="sync-7").key == "store-7"
        assert RecurringSchedule.objects.get(name="digest").key is None
        published = load_published()
        assert published is not None
        assert {r.name: r.key for r in published.recurrences} == {
            "sync-7": "store-7",
            "digest": None,
        }
        running(worker)
        wait_until(lambda: redis_client.zcard(KEYS.pending) == 2)
    (tick,) = [i for i in flow_keys(redis_client) if i.startswith("sync-7@")]
    assert flow_keys(redis_client) == {tick: "store-7"}


@pytest.mark.django_db(transaction=True)
def test_staff_give_a_schedule_a_key_in_the_admin_and_run_now_sends_it(
    redis_client: redis.Redis, admin_client: Any
) -> None:
    with configure({}):
        assert 'name="key"' in admin_client.get(f"{ADMIN}add/").content.decode()
        form = change_form("by-staff", QUEUE, key="store-3")
        response = admin_client.post(f"{ADMIN}add/", form)
        assert response.status_code == 302, response.content.decode()[:3000]
        row = RecurringSchedule.objects.get(name="by-staff")
        assert row.key == "store-3" and row.definition()["key"] == "store-3"
        admin_client.post(ADMIN, {"action": "run_now", "_selected_action": [row.pk]})
    assert list(flow_keys(redis_client).values()) == ["store-3"]


def change_form(name: str, queue: str, **changes: str) -> dict[str, Any]:
    form = {
        "name": name,
        "queue": queue,
        "cron": "",
        "every": "3600",
        "timezone": "UTC",
        "payload": json.dumps({"n": 1}),
        "task": "",
        "backend": "default",
        "args": "[]",
        "kwargs": "{}",
        "catch_up": "latest",
        "catch_up_limit": "100",
        "key": "",
    }
    form.update(changes)
    return form


def names_for(key: str) -> tuple[str, str]:
    """A schedule name on the key's shard (of 4) and one elsewhere."""
    home = key_shard(key, 4)
    fits = next(f"sync-{n}" for n in range(100) if shard_index(f"sync-{n}", 4) == home)
    away = next(f"sync-{n}" for n in range(100) if shard_index(f"sync-{n}", 4) != home)
    return fits, away


def test_the_checks_refuse_a_keyed_schedule_a_sharded_queue_cannot_keep() -> None:
    fits, away = names_for("store-1")
    schedules = {
        fits: {"queue": SHARDED, "every": 60, "key": "store-1"},
        away: {"queue": SHARDED, "every": 60, "key": "store-1"},
        "unkeyed": {"queue": SHARDED, "every": 60},
        "bad-key": {"queue": QUEUE, "every": 60, "key": ""},
    }
    with configure(schedules):
        errors = check_schedules()
    assert [e.id for e in errors] == ["delayqueue.E009"] * 2
    assert f"[{away!r}]: its key 'store-1' cannot be kept" in errors[0].msg
    assert "name the schedule so that both are one" in errors[0].msg
    assert "'key': key must be a non-empty string" in errors[1].msg


@pytest.mark.django_db
def test_the_admin_refuses_a_key_a_sharded_queue_cannot_keep(admin_client: Any) -> None:
    fits, away = names_for("store-1")
    with configure({}):
        page = admin_client.post(f"{ADMIN}add/", change_form(away, SHARDED, key="store-1"))
        assert "name the schedule so that both are one" in page.content.decode()
        assert not RecurringSchedule.objects.exists()
        response = admin_client.post(f"{ADMIN}add/", change_form(fits, SHARDED, key="store-1"))
        assert response.status_code == 302
        assert RecurringSchedule.objects.get(name=fits).key == "store-1"


def test_a_task_schedule_s_ticks_take_the_task_s_key_argument() -> None:
    from tests.settings import TASKS_SETTING

    default = TASKS_SETTING["default"]
    options = {**default["OPTIONS"], "KEY_ARGUMENT": "store_id"}
    with override_settings(TASKS={"default": {**default, "OPTIONS": options}}):
        import task_key_examples  # noqa: F401  (the task a tick runs is imported by its path)

        def schedule(**values: Any) -> Recurrence:
            return Recurrence("sync", "shop-tasks", every=60, **values)

        by_kwargs = schedule(task="task_key_examples.sync_store", kwargs={"store_id": 5})
        by_args = schedule(task="task_key_examples.sync_store", args=["store-6"])
        keyed = schedule(task="task_key_examples.sync_store", args=[6], key="own-key")
        other = schedule(task="task_key_examples.unkeyed", args=[1])
        assert tick_key(by_kwargs) == "5" and tick_key(by_args) == "store-6"
        assert tick_key(keyed) == "own-key"  # the schedule's own key wins
        assert tick_key(other) is None
        assert tick_key(schedule(payload={"n": 1})) is None
