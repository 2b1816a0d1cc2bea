"""The "Delay queues" admin pages and actions, with the test client.

Messages are created with the core ``Queue`` on the same prefix as the settings ("dq"); the
permission matrix is in test_admin_permissions.py.
"""

from __future__ import annotations

import json

import pytest
import redis
from admin_support import OVERVIEW, QUEUE, action_url, bury, page, where
from django.test import Client, override_settings
from django.urls import reverse

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess, free_port
from django_delayqueue.models import QueueConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def q(redis_client) -> Queue:
    return Queue(redis_client, QUEUE, prefix="dq")


# --- pages ---------------------------------------------------------------------------------


def test_overview_lists_every_queue_with_its_counts(admin_client, q, redis_client):
    q.schedule({"order_id": 1}, delay=600)
    q.schedule({"order_id": 2}, delay=600)
    bury(q, "dead-1")
    redis_client.zadd(q.keys.heartbeats, {"worker-a": q.clock.now_ms()})
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    assert [r["name"] for r in response.context["rows"]] == ["order-close", "activation-sms"]
    row = response.context["rows"][0]
    assert {c["state"]: c["value"] for c in row["counts"]} == {
        "pending": 2,
        "ready": 0,
        "unack": 0,
        "retry": 0,
        "garbage": 1,
    }
    assert row["consumers_alive"] == 1 and row["paused"] is False
    html = response.content.decode()
    assert 'td class="dq-num dq-count" data-state="garbage"' in html
    assert page(QUEUE, "garbage") in html  # the count links to the state's page
    assert "admin/base_site.html" in [t.name for t in response.templates]


def test_overview_shows_each_redis_server_and_no_banner_when_all_is_well(admin_client, q):
    response = admin_client.get(OVERVIEW)
    (server,) = response.context["servers"]
    assert server["policy"] == "noeviction" and not server["evicts"]
    assert "(no maxmemory)" in server["memory"]
    assert response.context["server_banners"] == []  # the embedded server: disposable
    assert 'id="dq-servers"' in response.content.decode()


def test_overview_banner_while_redis_evicts_or_is_full(admin_client):
    args = ("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
    with RedisServerProcess(args=args, mark_embedded=False) as server:
        config = {"REDIS_URL": server.url, "PREFIX": "dq", "QUEUES": {"order-close": {}}}
        with override_settings(DELAYQUEUE=config):
            evicting = admin_client.get(OVERVIEW)
            admin = redis.Redis.from_url(server.url)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("appendonly", "yes")
            admin.config_set("maxmemory", 1)
            full = admin_client.get(OVERVIEW)
            admin.config_set("maxmemory", 0)
            fine = admin_client.get(OVERVIEW)
            admin.close()
    kinds = [b["kind"] for b in evicting.context["server_banners"]]
    assert kinds == ["evicting", "not-persistent"]
    html = evicting.content.decode()
    assert 'data-kind="evicting"' in html and "maxmemory-policy allkeys-lru" in html
    assert "of 100.0 MB" in evicting.context["servers"][0]["memory"]
    (banner,) = full.context["server_banners"]
    assert banner["kind"] == "out-of-memory" and banner["error"]
    assert fine.context["server_banners"] == []  # only while the condition holds


def test_overview_is_listed_in_the_admin_index(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert OVERVIEW in html and "Queued messages" in html


def test_queue_page_shows_messages_of_one_state(admin_client, q):
    long_payload = {"text": "x" * 500}
    q.schedule(long_payload, delay=600, id="long-one")
    bury(q, "dead-1", reason="card declined")
    response = admin_client.get(page(state="pending"))
    assert response.status_code == 200
    (row,) = response.context["rows"]
    assert row["id"] == "long-one"
    assert len(row["preview"]) == 120 and row["preview"].endswith("…")
    assert row["due_at"] is not None and row["attempts"] == 0
    assert [a["action"] for a in response.context["row_actions"]] == ["run-now", "cancel"]

    response = admin_client.get(page(state="garbage"))
    (row,) = response.context["rows"]
    assert row["id"] == "dead-1" and row["reason"] == "card declined" and row["attempts"] == 1
    assert [a["action"] for a in response.context["row_actions"]] == ["requeue", "purge"]
    assert "card declined" in response.content.decode()


def test_queue_page_without_state_shows_pending(admin_client, q):
    q.schedule({"a": 1}, delay=60, id="p1")
    response = admin_client.get(page())
    assert response.context["state"] == "pending"
    assert [r["id"] for r in response.context["rows"]] == ["p1"]


def test_queue_page_pages_through_messages(admin_client, q):
    q.schedule_many({"payload": i, "id": f"m{i:03}", "delay": 60 + i} for i in range(120))
    first = admin_client.get(page(state="pending"))
    assert len(first.context["rows"]) == 50 and first.context["pages"] == 3
    assert first.context["previous_url"] is None and first.context["next_url"]
    third = admin_client.get(page(state="pending", p=3))
    assert [r["id"] for r in third.context["rows"]] == [f"m{i:03}" for i in range(100, 120)]
    assert third.context["next_url"] is None
    beyond = admin_client.get(page(state="pending", p=99))  # clamps to the last page
    assert beyond.context["page"] == 3 and len(beyond.context["rows"]) == 20
    assert admin_client.get(page(state="pending", p="x")).context["page"] == 1


def test_corrupt_envelope_is_shown_as_stored(admin_client, q, redis_client):
    q.schedule({"ok": True}, delay=60, id="bad")
    redis_client.hset(q.keys.messages, "bad", "{not json")
    response = admin_client.get(page(state="pending"))
    (row,) = response.context["rows"]
    assert row["corrupt"] and row["preview"] == "{not json"
    assert "corrupt:" in response.content.decode()


def test_unknown_queue_and_state_are_404(admin_client):
    assert admin_client.get(page("no-such-queue")).status_code == 404
    assert admin_client.get(page(state="sideways")).status_code == 404
    assert admin_client.post(action_url("requeue", "no-such-queue")).status_code == 404
    assert admin_client.post(action_url("explode")).status_code == 404


def test_pages_render_when_redis_is_down(admin_client):
    dead = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "REDIS_OPTIONS": {"socket_connect_timeout": 0.5},
        "PREFIX": "dq",
        "QUEUES": {"order-close": {}, "activation-sms": {}},
    }
    with override_settings(DELAYQUEUE=dead):
        overview = admin_client.get(OVERVIEW)
        assert overview.status_code == 200
        assert all(c["value"] is None for c in overview.context["rows"][0]["counts"])
        assert overview.context["errors"] and "errornote" in overview.content.decode()
        queue = admin_client.get(page(state="garbage"))
        assert queue.status_code == 200 and queue.context["rows"] == []
        assert any("messages:" in e for e in queue.context["errors"])
        response = admin_client.post(action_url("requeue"), {"id": "x"}, follow=True)
        assert response.status_code == 200
        (message,) = response.context["messages"]
        assert "Requeue failed" in str(message)


# --- actions -------------------------------------------------------------------------------


def test_requeue_one_selected_and_all(admin_client, q):
    bury(q, "a", "b", "c", "d")
    response = admin_client.post(
        action_url("requeue"), {"id": "a", "ids": ["b"], "state": "garbage"}
    )
    assert response.status_code == 302 and response["Location"] == page(state="garbage")
    assert where(q, "a") == "ready" and where(q, "b") == "garbage"  # the button's id only

    admin_client.post(action_url("requeue"), {"ids": ["b", "c", "gone"], "state": "garbage"})
    assert where(q, "b") == where(q, "c") == "ready"
    response = admin_client.get(page(state="garbage"))
    texts = [str(m) for m in response.context["messages"]]
    assert texts[-1] == (
        "Requeued 2 message(s) to ready. 1 was no longer in a state this action applies to."
    )

    # "all" asks first, and changes nothing until confirmed.
    confirm = admin_client.post(action_url("requeue"), {"all": "1", "state": "garbage"})
    assert confirm.status_code == 200 and confirm.context["count"] == 1
    assert "Are you sure" in confirm.content.decode() and where(q, "d") == "garbage"
    admin_client.post(action_url("requeue"), {"all": "1", "confirm": "yes", "state": "garbage"})
    assert where(q, "d") == "ready" and q.counts()["garbage"] == 0


def test_delete_one_selected_and_all_dead_letters(admin_client, q):
    bury(q, "a", "b", "c", "d", "e")
    admin_client.post(action_url("purge"), {"id": "a"})
    assert where(q, "a") is None and q.client.hget(q.keys.messages, "a") is None
    admin_client.post(action_url("purge"), {"ids": ["b", "c"]})
    assert where(q, "b") is None and where(q, "c") is None
    confirm = admin_client.post(action_url("purge"), {"all": "1"})
    assert confirm.status_code == 200 and "deleted for good" in confirm.content.decode()
    assert q.counts()["garbage"] == 2
    admin_client.post(action_url("purge"), {"all": "1", "confirm": "yes"})
    assert q.counts()["garbage"] == 0 and q.client.hlen(q.keys.messages) == 0


def test_cancel_and_run_now(admin_client, q):
    for i in range(3):
        q.schedule({"i": i}, delay=600, id=f"p{i}")
    admin_client.post(action_url("run-now"), {"id": "p0", "state": "pending"})
    assert where(q, "p0") == "ready"
    admin_client.post(action_url("cancel"), {"ids": ["p1", "p0"], "state": "pending"})
    assert where(q, "p1") is None and where(q, "p0") is None  # ready messages cancel too
    assert where(q, "p2") == "pending"


def test_run_now_and_cancel_act_on_retrying_messages(admin_client, q):
    q.schedule({"x": 1}, id="r1")
    q.schedule({"x": 2}, id="r2")
    for message in q.claim(2):
        q.nack(message, delay=600, reason="flaky")
    assert where(q, "r1") == "retry"
    page_ = admin_client.get(page(state="retry"))
    assert {r["reason"] for r in page_.context["rows"]} == {"flaky"}
    admin_client.post(action_url("run-now"), {"id": "r1", "state": "retry"})
    admin_client.post(action_url("cancel"), {"id": "r2", "state": "retry"})
    assert where(q, "r1") == "ready" and where(q, "r2") is None


def test_nothing_selected_does_nothing(admin_client, q):
    bury(q, "a")
    response = admin_client.post(action_url("purge"), {"state": "garbage"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "No messages selected: nothing was done."
    ]
    assert where(q, "a") == "garbage"


def test_all_is_only_for_dead_letters(admin_client, q):
    q.schedule({"x": 1}, delay=60, id="p1")
    response = admin_client.post(action_url("cancel"), {"all": "1", "confirm": "yes"}, follow=True)
    (message,) = response.context["messages"]
    assert "selected messages only" in str(message)
    assert where(q, "p1") == "pending"


def test_get_on_an_action_does_nothing(admin_client, q):
    bury(q, "a")
    for action in ("requeue", "purge", "cancel", "run-now", "pause", "resume"):
        response = admin_client.get(action_url(action) + "?id=a&all=1&confirm=yes")
        assert response.status_code == 405
    assert where(q, "a") == "garbage"
    assert not QueueConfig.objects.filter(name=QUEUE, paused=True).exists()
    assert admin_client.post(page(state="garbage"), {"id": "a"}).status_code == 405


def test_pause_and_resume_publish_to_redis(
    admin_client, q, redis_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(action_url("pause"), {"state": "garbage"})
    assert response.status_code == 302 and response["Location"] == page(state="garbage")
    assert QueueConfig.objects.get(name=QUEUE).paused is True
    assert json.loads(redis_client.hget(q.keys.config, "paused")) is True
    overview = admin_client.get(OVERVIEW)
    assert overview.context["rows"][0]["paused"] is True
    assert "dq-paused" in overview.content.decode()
    queue_page = admin_client.get(page())
    assert queue_page.context["pause_action"]["action"] == "resume"
    row = QueueConfig.objects.get(name=QUEUE)
    change = reverse("admin:django_delayqueue_queueconfig_change", args=[row.pk])
    assert queue_page.context["settings_url"] == change

    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(action_url("resume"))
    assert QueueConfig.objects.get(name=QUEUE).paused is False
    assert json.loads(redis_client.hget(q.keys.config, "paused")) is False
    assert admin_client.get(page()).context["pause_action"]["action"] == "pause"


def test_csrf_is_enforced_on_actions(admin_user, q):
    bury(q, "a")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(action_url("purge"), {"id": "a"}).status_code == 403
    assert client.post(action_url("pause")).status_code == 403
    assert where(q, "a") == "garbage"
    client.get(page(state="garbage"))  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(action_url("purge"), {"id": "a", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and where(q, "a") is None


def test_queue_config_admin_edits_and_publishes(
    admin_client, redis_client, django_capture_on_commit_callbacks
):
    row = QueueConfig.objects.get(name=QUEUE)
    changelist = reverse("admin:django_delayqueue_queueconfig_changelist")
    response = admin_client.get(changelist)
    assert response.status_code == 200 and QUEUE in response.content.decode()
    assert reverse("admin:django_delayqueue_queueconfig_add") not in response.content.decode()
    change = reverse("admin:django_delayqueue_queueconfig_change", args=[row.pk])
    data = {
        "paused": "on",
        "max_attempts": 9,
        "backoff_base": 2,
        "backoff_max": 60,
        "visibility_timeout": 30,
        "claim_batch": 10,
        "concurrency": 2,
        "soft_time_limit": 20,
        "time_limit": 25,
        "abort_grace_seconds": 5,
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(change, data)
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.paused and row.max_attempts == 9
    assert (row.soft_time_limit, row.time_limit, row.abort_grace_seconds) == (20, 25, 5)
    config = Queue(redis_client, QUEUE, prefix="dq").keys.config
    assert json.loads(redis_client.hget(config, "max_attempts")) == 9
    assert json.loads(redis_client.hget(config, "time_limit")) == 25
    bad = admin_client.post(change, {**data, "backoff_max": 1})  # below backoff_base
    assert bad.status_code == 200 and "backoff_max" in bad.content.decode()
    order = admin_client.post(change, {**data, "time_limit": 20})  # not above the soft limit
    assert "time_limit must be greater than soft_time_limit" in order.content.decode()
    uncovered = admin_client.post(change, {**data, "time_limit": 29})  # visibility 30
    assert "visibility_timeout must be at least time_limit + 2s" in uncovered.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        cleared = admin_client.post(change, {**data, "soft_time_limit": "", "time_limit": ""})
    assert cleared.status_code == 302
    assert json.loads(redis_client.hget(config, "time_limit")) is None  # no limit again


@pytest.mark.parametrize("typed", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("field", ["visibility_timeout", "backoff_max", "time_limit"])
def test_queue_settings_refuse_nan_and_infinity_by_name(admin_client, typed, field):
    """Issue 37: Django's own FloatField answered "Enter a number." to "nan" (which Python reads
    as a number), and "inf" for "no limit" got the same riddle."""
    row = QueueConfig.objects.get(name=QUEUE)
    change = reverse("admin:django_delayqueue_queueconfig_change", args=[row.pk])
    data = {
        "max_attempts": 5,
        "backoff_base": 1,
        "backoff_max": 60,
        "visibility_timeout": 30,
        "claim_batch": 10,
        "concurrency": 2,
        "abort_grace_seconds": 5,
    }
    response = admin_client.post(change, {**data, field: typed})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    (said,) = errors[field]
    assert said.startswith("Enter a finite number of seconds, not ")
    assert QueueConfig.objects.get(name=QUEUE).visibility_timeout == row.visibility_timeout


def test_a_schedule_every_of_infinity_is_refused_by_name(admin_client):
    response = admin_client.post(
        "/admin/django_delayqueue/recurringschedule/add/",
        {"name": "forever", "queue": QUEUE, "every": "inf", "timezone": "UTC", "payload": "{}"},
    )
    assert response.status_code == 200
    (said,) = response.context["adminform"].form.errors["every"]
    assert said.startswith("Enter a finite number of seconds, not inf")


def test_queue_config_list_editable_pauses(
    admin_client, redis_client, django_capture_on_commit_callbacks
):
    rows = list(QueueConfig.objects.order_by("name"))
    data = {"form-TOTAL_FORMS": len(rows), "form-INITIAL_FORMS": len(rows), "_save": "Save"}
    for i, row in enumerate(rows):
        data[f"form-{i}-id"] = row.pk
        data[f"form-{i}-max_attempts"] = row.max_attempts
        if row.name == QUEUE:
            data[f"form-{i}-paused"] = "on"
    changelist = reverse("admin:django_delayqueue_queueconfig_changelist")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(changelist, data)
    assert response.status_code == 302
    assert QueueConfig.objects.get(name=QUEUE).paused
    assert not QueueConfig.objects.get(name="activation-sms").paused
    assert admin_client.get(OVERVIEW).context["rows"][0]["paused"] is True


# --- recurring schedules: the list stays up whatever a row holds ----------------------------


def test_the_schedules_list_shows_a_row_past_validation_with_its_problem(admin_client, q):
    from django_delayqueue.models import RecurringSchedule

    schedules = "/admin/django_delayqueue/recurringschedule/"
    # Stored past validation (update() skips clean(); an older release let both through).
    huge = RecurringSchedule.objects.create(name="huge", queue=QUEUE, every=60)
    RecurringSchedule.objects.filter(pk=huge.pk).update(every=4e11)
    RecurringSchedule.objects.create(name="seconds", queue=QUEUE, cron="*/5 * * * * *")
    RecurringSchedule.objects.create(name="fine", queue=QUEUE, every=60)
    # A last run nothing could have written, and a state whose cursor no date can show.
    q.client.hset(q.keys.tick_runs, "fine", '{"tick": 1e300, "outcome": "ack"}')
    q.client.hset(q.keys.recurrence_states, "fine", f"{4 * 10**14} abc 0")
    response = admin_client.get(schedules)
    assert response.status_code == 200
    rows = {r.name: r.dq_status for r in response.context["cl"].result_list}
    assert rows["huge"].error.startswith("invalid: schedule 'huge': 'every' must be")
    assert "at most 315360000" in response.content.decode()
    assert "five fields" in rows["seconds"].error
    assert not rows["fine"].error and rows["fine"].last_tick_ms is None
    assert rows["fine"].next_run_ms is not None and rows["fine"].next_run_ms < 10**14
    change = admin_client.get(f"{schedules}{huge.pk}/change/")
    assert change.status_code == 200


def test_flow_limits_are_edited_in_the_admin_and_shown_on_the_queue_page(
    admin_client, redis_client, q, django_capture_on_commit_callbacks
):
    row = QueueConfig.objects.get(name=QUEUE)
    change = reverse("admin:django_delayqueue_queueconfig_change", args=[row.pk])
    data = {
        "max_attempts": 5,
        "backoff_base": 1,
        "backoff_max": 60,
        "visibility_timeout": 30,
        "claim_batch": 10,
        "concurrency": 2,
        "abort_grace_seconds": 5,
        "rate_limit": "2/s burst 2",
        "max_in_flight": 10,
    }
    bad = admin_client.post(change, {**data, "rate_limit": "2 a second"})
    assert bad.status_code == 200 and "rate_limit must be" in bad.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.post(change, data).status_code == 302
    config = q.keys.config
    assert json.loads(redis_client.hget(config, "rate_limit")) == "2/s burst 2"
    assert json.loads(redis_client.hget(config, "max_in_flight")) == 10
    # A consumer's claims under the published limits: the burst of 2, the other 3 wait.
    limited = Queue(redis_client, QUEUE, prefix="dq")
    limited.settings = limited.settings.replace(rate_limit="2/s burst 2", max_in_flight=10)
    limited.schedule_many([{"payload": i} for i in range(5)])
    assert len(limited.claim(5)) == 2
    response = admin_client.get(page(state="ready"))
    flow = response.context["flow"]
    assert (flow.rate_limit, flow.max_in_flight, flow.held, flow.waiting) == (
        "2/s burst 2",
        10,
        "rate",
        3,
    )
    text = response.content.decode()
    assert 'id="dq-flow"' in text and "3 waiting on the rate limit" in text
    with django_capture_on_commit_callbacks(execute=True):
        cleared = admin_client.post(change, {**data, "rate_limit": "", "max_in_flight": ""})
    assert cleared.status_code == 302
    assert json.loads(redis_client.hget(config, "rate_limit")) is None
    assert 'id="dq-flow"' not in admin_client.get(page()).content.decode()
