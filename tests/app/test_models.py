"""django_delayqueue.models and the settings mirror: settings <-> rows <-> Redis <-> workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import override_settings
from waiting import wait_until

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.mirror.kinds import queue_settings_mirror, set_paused
from django_delayqueue.models import MIRRORED_FIELDS, QueueConfig, QueueMessage
from django_delayqueue.worker import Worker

CONFIG_KEY = QueueKeys("dq", "order-close").config
FAST = 0.1  # SETTINGS_REFRESH_SECONDS in the tests that wait for a refresh
WAIT = 10.0  # upper bound of every wait below; they normally end within a few FAST


def delayqueue(**changes: Any) -> dict[str, Any]:
    return {**settings.DELAYQUEUE, **changes}


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(WAIT)
        assert not thread.is_alive(), "worker did not stop"


def published(client: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(CONFIG_KEY).items()}


# --- the rows -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_migrate_created_a_row_per_configured_queue() -> None:
    rows = {row.name: row for row in QueueConfig.objects.all()}
    assert set(rows) == {"order-close", "activation-sms"}
    sms = rows["activation-sms"]
    assert (sms.max_attempts, sms.backoff_base, sms.paused) == (3, 5.0, False)
    assert set(sms.from_settings) == set(MIRRORED_FIELDS)
    assert str(sms) == "activation-sms"
    sms.paused = True
    assert str(sms) == "activation-sms (paused)"


@pytest.mark.django_db
def test_sync_keeps_staff_edits_and_takes_settings_changes(redis_client: redis.Redis) -> None:
    row = QueueConfig.objects.get(name="order-close")
    row.max_attempts = 9  # staff raised it in the admin
    row.save()
    queues = {**settings.DELAYQUEUE["QUEUES"], "order-close": {"backoff_base": 4.0}}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        queue_settings_mirror.sync()
    row.refresh_from_db()
    assert (row.max_attempts, row.backoff_base) == (9, 4.0)
    # A later change of the same field in the settings file wins over the staff value.
    queues["order-close"] = {"backoff_base": 4.0, "max_attempts": 2}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        queue_settings_mirror.sync()
    row.refresh_from_db()
    assert row.max_attempts == 2


@pytest.mark.django_db
def test_sync_adds_rows_for_new_queues_and_skips_invalid_ones(redis_client: redis.Redis) -> None:
    queues = {**settings.DELAYQUEUE["QUEUES"], "new": {"paused": True}, "bad": {"claim_batch": 0}}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        rows = queue_settings_mirror.sync()
    assert {r.name for r in rows} == {"order-close", "activation-sms", "new"}
    assert QueueConfig.objects.get(name="new").paused is True
    assert not QueueConfig.objects.filter(name="bad").exists()
    assert redis_client.hget(QueueKeys("dq", "new").config, "paused") == b"true"


@pytest.mark.django_db
def test_clean_reports_invalid_values() -> None:
    row = QueueConfig(name="x", max_attempts=0, backoff_base=10, backoff_max=1)
    with pytest.raises(ValidationError) as info:
        row.full_clean()
    text = str(info.value)
    assert "max_attempts must be at least 1" in text and "backoff_max" in text


@pytest.mark.django_db
def test_queue_message_only_carries_permissions() -> None:
    assert QueueMessage._meta.managed is False
    codenames = set(
        Permission.objects.filter(content_type__model="queuemessage").values_list(
            "codename", flat=True
        )
    )
    assert codenames == {"view_queuemessage", "change_queuemessage", "delete_queuemessage"}


# --- publishing ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_saving_a_row_publishes_it_on_commit(
    redis_client: redis.Redis, django_capture_on_commit_callbacks: Any
) -> None:
    row = QueueConfig.objects.get(name="order-close")
    row.max_attempts, row.paused = 8, True
    with django_capture_on_commit_callbacks(execute=True):
        row.save()
    first = published(redis_client)
    assert (first["max_attempts"], first["paused"]) == ("8", "true")
    assert int(first["updated_ms"]) > 0
    with django_capture_on_commit_callbacks(execute=True):
        set_paused("order-close", False)
    second = published(redis_client)
    assert second["paused"] == "false"
    assert int(second["version"]) == int(first["version"]) + 1


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_edit_is_not_published(redis_client: redis.Redis) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        row = QueueConfig.objects.get(name="order-close")
        row.paused = True
        row.save()
        raise RuntimeError
    assert published(redis_client) == {}
    assert QueueConfig.objects.get(name="order-close").paused is False


@pytest.mark.django_db(transaction=True)
def test_publish_failure_does_not_fail_the_save(redis_client: redis.Redis) -> None:
    from django_delayqueue.embedded import free_port

    dead = delayqueue(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    with override_settings(DELAYQUEUE=dead):
        set_paused("order-close", True)  # logged, not raised
    assert QueueConfig.objects.get(name="order-close").paused is True


# --- reaching producers and consumers -----------------------------------------------------------


@pytest.mark.django_db
def test_a_published_change_reaches_get_queue_within_the_refresh(
    redis_client: redis.Redis,
) -> None:
    with override_settings(DELAYQUEUE=delayqueue(SETTINGS_REFRESH_SECONDS=FAST)):
        q = dq.get_queue("order-close")
        assert q.settings.max_attempts == 5
        # As another process's admin save would: straight to Redis, no local cache reset.
        redis_client.hset(CONFIG_KEY, mapping={"max_attempts": "12", "version": "1"})
        wait_until(lambda: dq.get_queue("order-close").settings.max_attempts == 12, WAIT)
        assert dq.get_queue("order-close") is q


@pytest.mark.django_db(transaction=True)
def test_a_pause_in_the_admin_stops_a_running_worker(redis_client: redis.Redis) -> None:
    delivered: list[str] = []

    def record(message: dq.Message, **kwargs: Any) -> None:
        delivered.append(message.id)

    dq.topic("order-close").connect(record)
    try:
        with override_settings(DELAYQUEUE=delayqueue(SETTINGS_REFRESH_SECONDS=FAST)):
            worker = Worker.for_queues(["order-close"], grace_seconds=2, idle_seconds=FAST)
            with running(worker):
                set_paused("order-close", True)  # autocommit: published at once
                wait_until(lambda: worker.queues[0].settings.paused, WAIT)
                message_id = dq.schedule("order-close", {"order_id": 0}, on_commit=False)
                # A few refresh rounds go by; the worker claims nothing meanwhile.
                time.sleep(5 * FAST)
                assert delivered == []
                assert redis_client.lrange(QueueKeys("dq", "order-close").ready, 0, -1) == [
                    message_id.encode()
                ]
                set_paused("order-close", False)
                wait_until(lambda: delivered == [message_id], WAIT)
    finally:
        dq.topic("order-close").disconnect(record)


@pytest.mark.django_db
def test_worker_starts_from_the_published_settings(redis_client: redis.Redis) -> None:
    queue_overrides.publish({"order-close": {"max_attempts": 7, "paused": True}})
    worker = Worker.for_queues(["order-close"])
    assert worker.queues[0].settings.max_attempts == 5  # the file, until the first refresh
    worker.refresh()
    assert (worker.queues[0].settings.max_attempts, worker.queues[0].settings.paused) == (7, True)


@pytest.mark.django_db
def test_worker_creates_rows_it_could_not_create_at_start(redis_client: redis.Redis) -> None:
    # The database was down when this worker started (no row was synced), Redis has nothing:
    # once the database answers, a refresh creates the row from the file and publishes it.
    QueueConfig.objects.filter(name="order-close").delete()
    worker = Worker.for_queues(["order-close"])
    worker.refresh()
    assert QueueConfig.objects.filter(name="order-close").exists()
    assert published(redis_client)["max_attempts"] == "5"


@pytest.mark.django_db
def test_worker_republishes_rows_that_redis_lost(redis_client: redis.Redis) -> None:
    QueueConfig.objects.filter(name="order-close").update(max_attempts=6)
    assert published(redis_client) == {}  # FLUSHALLed, as after a restart without persistence
    worker = Worker.for_queues(["order-close"])
    worker.refresh()
    assert published(redis_client)["max_attempts"] == "6"
    worker.refresh()
    assert worker.queues[0].settings.max_attempts == 6
