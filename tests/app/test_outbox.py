"""The transactional outbox (``DELAYQUEUE['OUTBOX']``, on by default) in one process, on SQLite.

Against the session's real Redis, and a port nothing listens on for a Redis that is down at the
commit. tests/drills/test_outbox_drill.py runs the same story with real ``runqueue`` processes, on
SQLite and on the PostgreSQL of this machine.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from memory_support import full

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.embedded import free_port
from django_delayqueue.models import OutboxMessage
from django_delayqueue.outbox.relay import OutboxRelay

KEYS = QueueKeys("dq", "order-close")
pytestmark = pytest.mark.django_db(transaction=True)


def redis_down(**extra: Any) -> Any:
    """Settings whose Redis refuses connections: a port nothing listens on."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "REDIS_URL": url, **extra})


def pending(client: redis.Redis) -> dict[bytes, float]:
    return dict(client.zrange(KEYS.pending, 0, -1, withscores=True))


@pytest.fixture
def outbox_on() -> Iterator[None]:
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OUTBOX": True}):
        yield


def test_the_outbox_is_on_by_default() -> None:
    from django_delayqueue.conf.settings import DEFAULTS

    assert DEFAULTS["OUTBOX"] is True


def test_a_committed_schedule_is_written_in_the_transaction_then_sent_and_deleted(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    with transaction.atomic():
        message_id = dq.schedule("order-close", {"order_id": 1}, delay=60)
        (row,) = OutboxMessage.objects.all()  # in the transaction, beside the order
        assert (row.queue, row.message_id, row.mode) == ("order-close", message_id, "schedule")
        assert pending(redis_client) == {}  # nothing sent before the commit
    assert list(OutboxMessage.objects.all()) == []
    assert pending(redis_client) == {message_id.encode(): row.due_ms}


def test_a_rollback_sends_nothing_and_leaves_no_row(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        dq.schedule("order-close", {"order_id": 2}, delay=60, id="rolled-back")
        raise RuntimeError("the order failed")
    assert OutboxMessage.objects.count() == 0
    assert pending(redis_client) == {} and redis_client.hlen(KEYS.messages) == 0


def test_outside_a_transaction_nothing_goes_through_the_outbox(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    message_id = dq.schedule("order-close", {"order_id": 3}, delay=60)
    assert message_id.encode() in pending(redis_client)
    assert OutboxMessage.objects.count() == 0


def test_redis_down_at_commit_keeps_the_row_and_the_relay_sends_it_with_its_due_time(
    redis_client: redis.Redis, outbox_on: None, caplog: pytest.LogCaptureFixture
) -> None:
    later: list[str] = []
    with redis_down(), transaction.atomic():
        message_id = dq.schedule("order-close", {"order_id": 4}, delay=600, id="close-4")
        transaction.on_commit(lambda: later.append("ran"))
    assert later == ["ran"]  # the commit's other callbacks still run
    (row,) = OutboxMessage.objects.all()
    assert row.attempts == 1 and "connecting" in row.last_error.lower()
    assert row.leased_until is None  # free for the relay at once
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "kept in the outbox" in caplog.text
    # Redis is back (the settings name the running one again): the relay sends it.
    done = OutboxRelay().relay_once()
    assert (done.sent, done.failed) == (1, 0)
    assert OutboxMessage.objects.count() == 0
    assert pending(redis_client) == {message_id.encode(): row.due_ms}  # its original due time
    envelope = redis_client.hget(KEYS.messages, message_id)
    assert decode_envelope(envelope)[2] == {"order_id": 4}


def test_a_relay_that_finds_redis_still_down_keeps_the_rows(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    with redis_down(), transaction.atomic():
        dq.schedule("order-close", {"n": 1}, delay=60, id="a")
        dq.schedule("order-close", {"n": 2}, delay=60, id="b")
    with redis_down():
        done = OutboxRelay().relay_once()
    assert (done.sent, done.failed) == (0, 2)
    assert sorted(OutboxMessage.objects.values_list("message_id", "attempts")) == [
        ("a", 2),
        ("b", 2),
    ]
    assert OutboxRelay().relay_once().sent == 2
    assert set(pending(redis_client)) == {b"a", b"b"}


def test_a_full_redis_at_commit_keeps_the_row_and_the_relay_sends_it_once_there_is_room(
    redis_client: redis.Redis, outbox_on: None, caplog: pytest.LogCaptureFixture
) -> None:
    relay = OutboxRelay()
    with full(redis_client):
        with transaction.atomic():
            dq.schedule("order-close", {"order_id": 5}, delay=600, id="close-5")
            dq.schedule("order-close", {"order_id": 6}, delay=600, id="close-6")
        rows = list(OutboxMessage.objects.order_by("message_id"))
        assert [r.message_id for r in rows] == ["close-5", "close-6"]  # kept, not lost
        assert "out of memory" in rows[0].last_error
        for _ in range(3):  # relay passes while Redis is still full: the rows wait
            assert relay.relay_once().failed == 2
        assert pending(redis_client) == {}  # nothing half-written
    said = [r for r in caplog.records if r.getMessage().startswith("outbox: Redis is out of")]
    assert len(said) == 1  # the relay said it once, not at every pass
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert relay.relay_once().sent == 2  # memory is back
    assert OutboxMessage.objects.count() == 0
    assert set(pending(redis_client)) == {b"close-5", b"close-6"}
    assert "room again" in caplog.text


def test_an_overdue_row_goes_straight_to_ready(redis_client: redis.Redis, outbox_on: None) -> None:
    with redis_down(), transaction.atomic():
        dq.schedule("order-close", {"n": 1}, at=timezone.now() - timedelta(minutes=5), id="late")
    assert OutboxRelay().relay_once().sent == 1
    assert redis_client.lrange(KEYS.ready, 0, -1) == [b"late"]  # delivered at once


def test_a_row_sent_twice_is_stored_once_even_after_its_message_was_acknowledged(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    with redis_down(), transaction.atomic():
        dq.schedule("order-close", {"n": 1}, id="once")
    (row,) = OutboxMessage.objects.all()
    assert OutboxRelay().relay_once().sent == 1
    queue = dq.get_queue("order-close")
    (message,) = queue.claim(10)
    assert queue.ack(message)
    # The first relay died after sending, before deleting: the row is back for another relay.
    row.leased_until = None
    row.save(force_insert=True)
    done = OutboxRelay().relay_once()
    assert (done.sent, done.already_sent) == (0, 1)
    assert OutboxMessage.objects.count() == 0
    assert queue.claim(10) == [] and redis_client.hlen(KEYS.messages) == 0


def test_a_leased_row_is_not_claimed_by_a_second_relay(outbox_on: None) -> None:
    with redis_down(), transaction.atomic():
        for n in range(3):
            dq.schedule("order-close", {"n": n}, delay=60, id=f"r{n}")
    first, second = OutboxRelay(), OutboxRelay()
    claimed = first.claim("default")
    assert len(claimed) == 3
    assert second.claim("default") == []
    # A lease that ran out (its relay died) frees the row for the other.
    OutboxMessage.objects.update(leased_until=timezone.now() - timedelta(seconds=1))
    assert len(second.claim("default")) == 3


def test_the_committing_process_holds_its_row_until_its_send_ends(outbox_on: None) -> None:
    captured: list[Any] = []
    with transaction.atomic():
        dq.schedule("order-close", {"n": 1}, delay=60)
        transaction.on_commit(lambda: captured.append(OutboxRelay().claim("default")))
    # Committed, then (on_commit in order) our send ran first and deleted the row: a relay
    # looking right after the commit never sees it free.
    assert captured == [[]]


def test_a_replace_goes_through_the_outbox_as_a_replace(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    dq.schedule("order-close", {"v": 1}, delay=60, id="x")
    with redis_down(), transaction.atomic():
        dq.schedule("order-close", {"v": 2}, delay=120, id="x", replace=True)
    assert OutboxMessage.objects.get().mode == "replace"
    assert OutboxRelay().relay_once().sent == 1
    assert decode_envelope(redis_client.hget(KEYS.messages, "x"))[2] == {"v": 2}


def test_without_the_outbox_nothing_is_written(redis_client: redis.Redis) -> None:
    off = override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OUTBOX": False})
    with off, transaction.atomic():
        message_id = dq.schedule("order-close", {"n": 1}, delay=60)
        assert OutboxMessage.objects.count() == 0
    assert message_id.encode() in pending(redis_client)


def test_a_row_of_a_queue_not_configured_here_waits_with_its_error(outbox_on: None) -> None:
    OutboxMessage.objects.create(
        queue="not-here", message_id="m", due_ms=0, envelope="{}", created_at=timezone.now()
    )
    done = OutboxRelay().relay_once()
    assert done.failed == 1
    row = OutboxMessage.objects.get()
    assert "not-here" in row.last_error and row.leased_until > timezone.now()


def test_the_relay_uses_skip_locked_where_the_database_has_it() -> None:
    # SQLite has no row locks: the conditional UPDATE path (tests/drills/test_outbox_drill.py runs
    # the SKIP LOCKED one on PostgreSQL).
    assert not connection.features.has_select_for_update_skip_locked


def test_an_outbox_row_id_is_a_fresh_uuid_token(outbox_on: None) -> None:
    with redis_down(), transaction.atomic():
        dq.schedule("order-close", {"n": 1}, id="same")
        dq.schedule("order-close", {"n": 2}, id="same")
    tokens = list(OutboxMessage.objects.values_list("id", flat=True))
    assert len(set(tokens)) == 2 and all(isinstance(t, uuid.UUID) for t in tokens)


# --- what staff and operators see ------------------------------------------------------------


def _waiting_row(seconds_ago: float, **fields: Any) -> OutboxMessage:
    return OutboxMessage.objects.create(
        queue="order-close",
        message_id=fields.pop("message_id", "m"),
        due_ms=1_700_000_000_000,
        envelope='{"v":1}',
        created_at=timezone.now() - timedelta(seconds=seconds_ago),
        **fields,
    )


def test_the_check_warns_when_rows_wait_longer_than_the_max_age() -> None:
    from django.core.checks import run_checks

    assert [m for m in run_checks(databases=["default"]) if m.id == "delayqueue.W004"] == []
    _waiting_row(90)
    (warning,) = [m for m in run_checks(databases=["default"]) if m.id == "delayqueue.W004"]
    assert "1 outbox message(s)" in warning.msg and "runqueue" in warning.hint
    # A relay that tries but cannot send says why instead.
    OutboxMessage.objects.update(relayed_at=timezone.now(), last_error="Connection refused")
    (warning,) = [m for m in run_checks(databases=["default"]) if m.id == "delayqueue.W004"]
    assert "Connection refused" in warning.hint
    # Not without --database: a check must not query a database it was not asked to.
    assert [m for m in run_checks() if m.id == "delayqueue.W004"] == []


@pytest.mark.parametrize("value", ["yes", 0, -1, None])
def test_bad_outbox_settings_are_errors(value: Any) -> None:
    from django.core.checks import run_checks

    name = "OUTBOX" if value == "yes" else "OUTBOX_RELAY_SECONDS"
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, name: value}):
        errors = [m for m in run_checks() if m.id == "delayqueue.E008"]
    assert len(errors) == 1 and name in errors[0].msg


def test_the_admin_overview_shows_the_backlog_and_its_page_lists_the_rows(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    overview = admin_client.get("/admin/django_delayqueue/queuemessage/")
    assert 'id="dq-outbox"' not in overview.content.decode()
    _waiting_row(120, message_id="close-9", last_error="Connection refused", attempts=3)
    text = admin_client.get("/admin/django_delayqueue/queuemessage/").content.decode()
    assert 'id="dq-outbox"' in text and "1 message</a>" in text and "2 min" in text
    assert "Connection refused" in text
    listing = admin_client.get("/admin/django_delayqueue/outboxmessage/").content.decode()
    assert "close-9" in listing and "Connection refused" in listing


def test_send_now_in_the_admin_relays_the_selected_rows(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    row = _waiting_row(5, message_id="close-10")
    response = admin_client.post(
        "/admin/django_delayqueue/outboxmessage/",
        {"action": "send_now", "_selected_action": [str(row.pk)]},
        follow=True,
    )
    assert "Sent 1" in response.content.decode()
    assert OutboxMessage.objects.count() == 0
    assert redis_client.hexists(KEYS.messages, "close-10")


def test_outbox_rows_need_their_own_permission(
    client: Any, django_user_model: Any, redis_client: redis.Redis
) -> None:
    from django.contrib.auth.models import Permission

    _waiting_row(5)
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_queuemessage"))
    client.force_login(user)
    assert client.get("/admin/django_delayqueue/outboxmessage/").status_code == 403
    text = client.get("/admin/django_delayqueue/queuemessage/").content.decode()
    assert 'id="dq-outbox"' in text and "/outboxmessage/" not in text  # told, not linked
    user.user_permissions.add(Permission.objects.get(codename="view_outboxmessage"))
    user = django_user_model.objects.get(pk=user.pk)
    client.force_login(user)
    listing = client.get("/admin/django_delayqueue/outboxmessage/")
    assert listing.status_code == 200 and "send_now" not in listing.content.decode()


# --- the Tasks backend ---------------------------------------------------------------------------


def test_a_task_enqueued_while_redis_is_down_runs_once_the_relay_sent_it(
    redis_client: redis.Redis,
) -> None:
    from django_delayqueue.tasks import framework
    from django_delayqueue.worker import Worker
    from tests.settings import TASKS_SETTING

    queues = {**settings.DELAYQUEUE["QUEUES"], "shop-tasks": {"backoff_base": 0}}
    delayqueue = {**settings.DELAYQUEUE, "QUEUES": queues, "OUTBOX": True}
    enqueued: list[str] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        enqueued.append(task_result.id)

    framework.task_enqueued.connect(on_enqueued)
    try:
        with override_settings(DELAYQUEUE=delayqueue, TASKS=TASKS_SETTING):
            import task_examples

            with redis_down(), transaction.atomic():
                result = task_examples.add.enqueue(2, 3)
            # Committed, kept in the outbox: the task is enqueued (the signal says so once).
            assert enqueued == [result.id]
            (row,) = OutboxMessage.objects.all()
            assert (row.mode, row.message_id) == ("task", result.id)
            # Redis is back, the relay has not run yet: the result is found, READY.
            waiting = task_examples.add.get_result(result.id)
            assert waiting.status == framework.TaskResultStatus.READY
            assert OutboxRelay().relay_once().sent == 1
            Worker.for_queues(["shop-tasks"], burst=True, name="outbox-test").run()
            done = task_examples.add.get_result(result.id)
            assert done.status == framework.SUCCESSFUL
            assert done.return_value == 5
            assert enqueued == [result.id]
    finally:
        framework.task_enqueued.disconnect(on_enqueued)


# --- review fixes ------------------------------------------------------------------------------


def test_a_full_batch_that_finds_redis_down_does_not_ask_for_another_pass_at_once(
    outbox_on: None,
) -> None:
    with redis_down(), transaction.atomic():
        for n in range(3):
            dq.schedule("order-close", {"n": n}, delay=60, id=f"f{n}")
    with redis_down():
        done = OutboxRelay(batch=3).relay_once()
    # Before: full=True with every send failed, and the relay thread spun without waiting.
    assert done.redis_down and not done.full and done.failed == 3


def test_a_burst_relays_every_row_not_only_one_batch(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    with redis_down(), transaction.atomic():
        for n in range(5):
            dq.schedule("order-close", {"n": n}, delay=60, id=f"b{n}")
    done = OutboxRelay(batch=2).relay_all()
    assert done.sent == 5 and OutboxMessage.objects.count() == 0
    assert len(pending(redis_client)) == 5


class NoOutboxHere:
    """A router that keeps this app's tables out of every database."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if app_label == "django_delayqueue" else None


def test_a_database_the_routers_keep_the_outbox_from_sends_on_commit_without_a_row(
    redis_client: redis.Redis, outbox_on: None
) -> None:
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.NoOutboxHere"]):
        with transaction.atomic():
            message_id = dq.schedule("order-close", {"n": 1}, delay=60)
            assert OutboxMessage.objects.count() == 0
        assert OutboxRelay().relay_once().handled == 0  # the relay leaves that database alone
    assert message_id.encode() in pending(redis_client)


def test_the_backlog_of_a_database_that_refuses_connections_is_tried_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that cannot be connected to: its failed read was followed by a second
    connect (to ask whether the table exists), so a probe waited out its connect timeout twice
    per pass. One attempt, and the database is said unreadable."""
    from django.db import connections
    from django.db.utils import ConnectionHandler

    from django_delayqueue.outbox.backlog import read_backlogs

    # SQLite cannot open a file in a folder that does not exist: every connect fails. Put in
    # the handler under an alias of its own (not in DATABASES: the test case allows it).
    gone = str(tmp_path / "gone" / "db.sqlite3")
    engine = "django.db.backends.sqlite3"
    down = ConnectionHandler({"default": {"ENGINE": engine, "NAME": gone}})
    database = down["default"]
    database.alias = "down"
    attempts: list[str] = []
    connect = database.get_new_connection

    def counted(params: dict[str, Any]) -> Any:
        attempts.append(params["database"])
        return connect(params)

    monkeypatch.setattr(database, "get_new_connection", counted)
    connections["down"] = database
    try:
        backlogs, unreadable = read_backlogs(["down"])
    finally:
        del connections["down"]
    assert backlogs == [] and list(unreadable) == ["down"]
    assert unreadable["down"].startswith("OperationalError: unable to open database file")
    assert attempts == [gone]  # once: not again to look for the table
