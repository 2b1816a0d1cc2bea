"""Recurring schedules through Django: DELAYQUEUE["SCHEDULES"], the admin's rows reaching a
running runqueue worker, "Run now", a periodic task, queuestats, metrics and the checks.

Workers run on threads against the suite's Redis on the real clock; every wait is for an
event (a tick delivered, a key changed), bounded only as a hang guard.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from core_consumer_support import Started
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from waiting import wait_until

import django_delayqueue as dq
from django_delayqueue.checks.recurrences import check_schedules
from django_delayqueue.core import Message, QueueKeys
from django_delayqueue.core.recurring import Recurrence, parse_tick_id
from django_delayqueue.mirror.kinds import recurrences_mirror
from django_delayqueue.mirror.recurrences import load_published
from django_delayqueue.models import RecurringSchedule
from django_delayqueue.worker import Worker

QUEUE = "reports"
KEYS = QueueKeys("dq", QUEUE)
ADMIN = "/admin/django_delayqueue/recurringschedule/"


def configure(schedules: dict[str, Any], **extra: Any) -> Any:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"max_attempts": 2, "backoff_base": 0}}
    return override_settings(
        DELAYQUEUE={
            **settings.DELAYQUEUE,
            "QUEUES": queues,
            "SCHEDULES": schedules,
            "SETTINGS_REFRESH_SECONDS": 0.2,
            **extra,
        }
    )


class Delivered:
    """A receiver on the reports queue recording every tick it gets."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.cond = threading.Condition()

    def __call__(self, message: Message, **kwargs: Any) -> None:
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def ticks(self, name: str) -> list[int]:
        with self.cond:
            return [p[1] for m in self.messages if (p := parse_tick_id(m.id)) and p[0] == name]

    def wait(self, condition: Callable[[], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(condition, 30), [m.id for m in self.messages]


@pytest.fixture
def delivered() -> Iterator[Delivered]:
    receiver = Delivered()
    dq.topic(QUEUE).connect(receiver, weak=False)
    yield receiver
    dq.topic(QUEUE).disconnect(receiver)


def start_worker(running: Started) -> Worker:
    """What ``runqueue reports`` does: sync the rows, then run the loop (on a thread)."""
    worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
    worker.sync_settings()
    running(worker)
    return worker


@pytest.mark.django_db(transaction=True)
def test_a_schedule_in_the_settings_fires_once_per_tick(
    redis_client: redis.Redis, delivered: Delivered, running: Started
) -> None:
    schedule = {"queue": QUEUE, "every": 1, "payload": {"kind": "beat"}, "catch_up": "all"}
    with configure({"beat": schedule}):
        start_worker(running)
        start_worker(running)  # two runqueues: still one message per tick
        delivered.wait(lambda: len(delivered.ticks("beat")) >= 3)
    ticks = delivered.ticks("beat")
    assert len(ticks) == len(set(ticks))  # none twice
    assert ticks == list(range(ticks[0], ticks[0] + 1000 * len(ticks), 1000))  # none skipped
    assert all(m.payload == {"kind": "beat"} for m in delivered.messages)
    assert all(m.due_ms == t for m, t in zip(delivered.messages, ticks, strict=True))
    assert RecurringSchedule.objects.get(name="beat").every == 1  # the row the sync made


@pytest.mark.django_db(transaction=True)
def test_admin_edits_reach_a_running_worker(
    redis_client: redis.Redis, admin_client: Any, delivered: Delivered, running: Started
) -> None:
    with configure({}):
        row = RecurringSchedule.objects.create(name="digest", queue=QUEUE, every=3600)
        start_worker(running)
        hourly = Recurrence("digest", QUEUE, every=3600)
        first = wait_until(lambda: redis_client.zrange(KEYS.pending, 0, -1))
        assert first == [hourly.tick_id(hourly.next_after(_now_ms())).encode()]

        # Edit in the admin: every 2 seconds. The waiting hourly tick is replaced.
        form = _change_form(row, every="2")
        response = admin_client.post(f"{ADMIN}{row.pk}/change/", form)
        assert response.status_code == 302, response.content.decode()[:2000]
        delivered.wait(lambda: len(delivered.ticks("digest")) >= 1)
        assert first[0] not in redis_client.zrange(KEYS.pending, 0, -1)
        assert not redis_client.hexists(KEYS.messages, first[0])
        assert all(t % 2000 == 0 for t in delivered.ticks("digest"))

        # Pause: the waiting tick is withdrawn and nothing more is created.
        form = _change_form(RecurringSchedule.objects.get(pk=row.pk), paused="on")
        assert admin_client.post(f"{ADMIN}{row.pk}/change/", form).status_code == 302
        wait_until(
            lambda: b"paused:" in (redis_client.hget(KEYS.recurrence_states, "digest") or b"")
        )
        assert redis_client.zcard(KEYS.pending) == 0

        # Delete: the schedule's state becomes a tombstone, its last run goes.
        assert redis_client.hexists(KEYS.tick_runs, "digest")
        response = admin_client.post(f"{ADMIN}{row.pk}/delete/", {"post": "yes"})
        assert response.status_code == 302
        wait_until(
            lambda: (redis_client.hget(KEYS.recurrence_states, "digest") or b"").startswith(
                b"0 deleted "
            )
        )
        assert not redis_client.hexists(KEYS.tick_runs, "digest")


@pytest.mark.django_db(transaction=True)
def test_a_deleted_schedule_s_waiting_tick_is_cancelled(
    redis_client: redis.Redis, running: Started
) -> None:
    with configure({}):
        row = RecurringSchedule.objects.create(name="nightly", queue=QUEUE, cron="0 3 * * *")
        start_worker(running)
        wait_until(lambda: redis_client.zcard(KEYS.pending) == 1)
        row.delete()
        wait_until(lambda: redis_client.zcard(KEYS.pending) == 0)
        assert redis_client.hlen(KEYS.messages) == 0


@pytest.mark.django_db(transaction=True)
def test_admin_list_shows_next_and_last_run_and_run_now_sends_a_tick(
    redis_client: redis.Redis, admin_client: Any, delivered: Delivered, running: Started
) -> None:
    # Twelve hours from now, so that the schedule's own tick never comes due during the test
    # (with a fixed hour, a run at that hour saw two ticks: its own and the one sent now).
    hour = (datetime.now(ZoneInfo("Europe/Berlin")).hour + 12) % 24
    cron = f"0 {hour} * * *"
    with configure({"nightly": {"queue": QUEUE, "cron": cron, "timezone": "Europe/Berlin"}}):
        start_worker(running)
        wait_until(lambda: redis_client.zcard(KEYS.pending) == 1)
        page = admin_client.get(ADMIN).content.decode()
        assert "nightly" in page and f"cron {cron} (Europe/Berlin)" in page
        assert "never" in page  # no run yet
        row = RecurringSchedule.objects.get(name="nightly")
        response = admin_client.post(
            ADMIN, {"action": "run_now", "_selected_action": [row.pk]}, follow=True
        )
        assert "Sent a tick of nightly now." in response.content.decode()
        delivered.wait(lambda: len(delivered.ticks("nightly")) == 1)
        wait_until(lambda: redis_client.hget(KEYS.tick_runs, "nightly"))
        page = admin_client.get(ADMIN).content.decode()
        assert "succeeded" in page and "never" not in page


@pytest.mark.django_db(transaction=True)
def test_a_user_who_may_only_view_cannot_run_a_schedule_now(
    redis_client: redis.Redis, client: Any, django_user_model: Any
) -> None:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_recurringschedule"))
    client.login(username="viewer", password="pw")
    with configure({}):
        row = RecurringSchedule.objects.create(name="digest", queue=QUEUE, every=60)
        assert client.get(ADMIN).status_code == 200
        client.post(ADMIN, {"action": "run_now", "_selected_action": [row.pk]})
    assert redis_client.zcard(KEYS.pending) + redis_client.llen(KEYS.ready) == 0


@pytest.mark.django_db(transaction=True)
def test_settings_sync_keeps_staff_edits_and_drops_schedules_that_left_the_file(
    redis_client: redis.Redis,
) -> None:
    with configure({"a": {"queue": QUEUE, "every": 60}, "b": {"queue": QUEUE, "every": 30}}):
        recurrences_mirror.sync()
        RecurringSchedule.objects.filter(name="a").update(paused=True)  # a staff edit
        RecurringSchedule.objects.create(name="by-staff", queue=QUEUE, every=10)
    with configure({"a": {"queue": QUEUE, "every": 120}}):
        recurrences_mirror.sync()
        a = RecurringSchedule.objects.get(name="a")
        assert (a.every, a.paused) == (120, True)  # the file's change, and the staff's
        assert sorted(RecurringSchedule.objects.values_list("name", flat=True)) == ["a", "by-staff"]
        published = load_published()
        assert published is not None
        assert sorted(r.name for r in published.recurrences) == ["a", "by-staff"]


def test_the_checks_name_a_bad_schedule_and_an_unknown_queue() -> None:
    bad = {
        "broken": {"queue": QUEUE, "cron": "0 25 * * *"},
        "nowhere": {"queue": "no-such-queue", "every": 60},
        "fine": {"queue": QUEUE, "every": 60},
        "huge": {"queue": QUEUE, "every": 4e11},
        "seconds": {"queue": QUEUE, "cron": "*/5 * * * * *"},
    }
    with configure(bad):
        errors = check_schedules()
    assert [e.id for e in errors] == ["delayqueue.E009"] * 4
    assert "schedule 'broken': bad cron expression" in errors[0].msg
    assert "queue 'no-such-queue' is not configured" in errors[1].msg
    assert "'every' must be a number of seconds, at least 1 and at most" in errors[2].msg
    assert "it has 6 field(s), a cron expression has five fields" in errors[3].msg


@pytest.mark.django_db(transaction=True)
def test_queuestats_shows_the_schedules(
    redis_client: redis.Redis, delivered: Delivered, running: Started
) -> None:
    with configure({"beat": {"queue": QUEUE, "every": 1}}):
        start_worker(running)
        delivered.wait(lambda: len(delivered.ticks("beat")) >= 1)
        wait_until(lambda: redis_client.hget(KEYS.tick_runs, "beat"))
        out = io.StringIO()
        call_command("queuestats", QUEUE, stdout=out)
        table = out.getvalue()
        assert "SCHEDULE" in table and "beat" in table and "every 1s" in table
        out = io.StringIO()
        call_command("queuestats", QUEUE, "--json", stdout=out)
        (beat,) = json.loads(out.getvalue())["schedules"]
        assert beat["last_outcome"] == "ack" and beat["next_run_ms"] > beat["last_tick_ms"]


@pytest.mark.django_db(transaction=True)
def test_metrics_show_the_schedules(
    redis_client: redis.Redis, delivered: Delivered, running: Started, client: Any
) -> None:
    pytest.importorskip("prometheus_client")  # the metrics extra (the main run has it)
    with configure({"beat": {"queue": QUEUE, "every": 1}}):
        start_worker(running)
        delivered.wait(lambda: len(delivered.ticks("beat")) >= 1)
        wait_until(lambda: redis_client.hget(KEYS.tick_runs, "beat"))
        text = client.get("/delayqueue/metrics/").content.decode()
        assert 'delayqueue_schedule_last_run_succeeded{queue="reports",schedule="beat"} 1.0' in text
        assert "delayqueue_schedule_next_run_timestamp_seconds{" in text


def _change_form(row: RecurringSchedule, **changes: str) -> dict[str, Any]:
    form = {
        "name": row.name,
        "queue": row.queue,
        "cron": row.cron,
        "every": "" if row.every is None else str(row.every),
        "timezone": row.timezone,
        "payload": json.dumps(row.payload),
        "task": row.task,
        "backend": row.backend,
        "args": json.dumps(row.args),
        "kwargs": json.dumps(row.kwargs),
        "catch_up": row.catch_up,
        "catch_up_limit": str(row.catch_up_limit),
    }
    if row.paused:
        form["paused"] = "on"
    form.update(changes)
    return form


def _now_ms() -> int:
    from django_delayqueue.conf.connection import get_clock

    return get_clock().now_ms()


@pytest.mark.django_db
def test_the_admin_refuses_a_schedule_that_cannot_run(admin_client: Any) -> None:
    with configure({}):
        bad_cron = {**_change_form(RecurringSchedule(name="x", queue=QUEUE)), "cron": "0 3 * *"}
        page = admin_client.post(f"{ADMIN}add/", bad_cron).content.decode()
        assert "bad cron expression" in page
        huge = _change_form(RecurringSchedule(name="h", queue=QUEUE, every=4e11))
        page = admin_client.post(f"{ADMIN}add/", huge).content.decode()
        assert "at most 315360000 (ten years)" in page
        no_queue = {**_change_form(RecurringSchedule(name="y", queue="nowhere", every=60))}
        page = admin_client.post(f"{ADMIN}add/", no_queue).content.decode()
        assert "is not a configured queue" in page
        assert not RecurringSchedule.objects.exists()
        RecurringSchedule.objects.create(name="z", queue=QUEUE)  # past validation: no cron
        assert admin_client.get(ADMIN).status_code == 200  # the list still renders


@pytest.mark.django_db
def test_the_published_version_only_grows_even_when_its_key_is_lost(
    redis_client: redis.Redis,
) -> None:
    from django_delayqueue.mirror.recurrences import published_key

    with configure({"a": {"queue": QUEUE, "every": 60}}):
        recurrences_mirror.sync()
        first = load_published()
        assert first is not None and first.version > 0
        assert recurrences_mirror.publish_from_db() > first.version
        redis_client.delete(published_key())  # Redis lost it: the next publish still grows
        assert recurrences_mirror.publish_from_db() > first.version


@pytest.mark.django_db
def test_one_schedule_on_a_removed_queue_does_not_blank_the_others(
    redis_client: redis.Redis,
) -> None:
    from django_delayqueue.monitoring.recurrences import statuses

    with configure({}):
        found = statuses(
            [Recurrence("gone", "removed-queue", every=60), Recurrence("fine", QUEUE, every=60)]
        )
    assert [bool(s.error) for s in found] == [True, False]
    assert found[1].next_run_ms is not None and found[0].next_run_ms is None


@pytest.mark.django_db
def test_the_database_check_names_a_row_no_runqueue_keeps(redis_client: redis.Redis) -> None:
    from django_delayqueue.checks.recurrences import check_schedule_rows

    with configure({}):
        RecurringSchedule.objects.create(name="orphan", queue="removed-queue", every=60)
        RecurringSchedule.objects.create(name="fine", queue=QUEUE, every=60)
        warnings = check_schedule_rows(databases=["default"])
        out = io.StringIO()
        call_command("queuestats", stdout=out, stderr=io.StringIO())
    assert [w.id for w in warnings] == ["delayqueue.W005"]
    assert "'orphan': queue 'removed-queue' is not configured" in warnings[0].msg
    assert "error: unknown queue 'removed-queue'" in out.getvalue()  # said, not a bare "-"


@pytest.mark.django_db(transaction=True)
def test_deleting_a_schedule_of_the_settings_file_in_the_admin_says_it_comes_back(
    redis_client: redis.Redis, admin_client: Any
) -> None:
    with configure({"nightly": {"queue": QUEUE, "cron": "0 3 * * *"}}):
        recurrences_mirror.sync()
        row = RecurringSchedule.objects.get(name="nightly")
        response = admin_client.post(f"{ADMIN}{row.pk}/delete/", {"post": "yes"}, follow=True)
    assert "comes from DELAYQUEUE" in response.content.decode().replace("come(s)", "comes")
