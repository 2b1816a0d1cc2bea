"""Atomic queues (django_delayqueue.inbox, docs/exactly-once.md): a handler's database work and
its inbox row commit together; a delivery found already done is acknowledged without running.

The window itself (a consumer killed between the commit and the ack) is drilled with a real
``runqueue`` in tests/drills/test_inbox_drill.py; here the handler runs in this process, on
the test database (SQLite), against the private Redis.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group
from django.test import override_settings

import django_delayqueue as dq
from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core import QueueKeys
from django_delayqueue.models import InboxEntry, OutboxMessage
from django_delayqueue.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "atomic-work"
NEXT = "atomic-next"
KEYS = QueueKeys("dq", QUEUE)


@pytest.fixture(autouse=True)
def atomic_queue(redis_client: redis.Redis) -> Iterator[None]:
    """An atomic queue retried at once, and a plain queue for the next step of a chain."""
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUE: {"atomic": True, "max_attempts": 3, "backoff_base": 0, "backoff_max": 0},
        NEXT: {},
    }
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        yield


@pytest.fixture
def receivers() -> Iterator[Callable[[Callable[..., Any]], None]]:
    connected: list[Callable[..., Any]] = []

    def connect(fn: Callable[..., Any]) -> None:
        dq.topic(QUEUE).connect(fn, weak=False)
        connected.append(fn)

    yield connect
    for fn in connected:
        dq.topic(QUEUE).disconnect(fn)


def burst() -> Worker:
    worker = Worker.for_queues([QUEUE], burst=True)
    worker.run()
    return worker


def journal_rows(client: redis.Redis) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for _, fields in client.xrange(KEYS.journal):
        rows.extend(json.loads(fields[b"o"]))
    return rows


def gone(client: redis.Redis, message_id: str) -> bool:
    return client.hget(KEYS.messages, message_id) is None


def test_a_handler_that_returns_commits_its_work_with_the_inbox_row(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    def handler(message: dq.Message, **kwargs: Any) -> None:
        Group.objects.create(name=f"effect-{message.id}")

    receivers(handler)
    dq.schedule(QUEUE, {}, id="m1")
    burst()
    assert Group.objects.filter(name="effect-m1").count() == 1
    row = InboxEntry.objects.get()
    scheduled = json.loads(json.dumps(row.scheduled_ms))
    assert (row.queue, row.message_id) == (QUEUE, "m1") and scheduled > 0
    assert gone(redis_client, "m1")
    assert [r[6] for r in journal_rows(redis_client)] == ["ack"]


def test_a_handler_that_raises_leaves_no_effect_and_no_inbox_row_and_is_retried(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    attempts: list[int] = []

    def handler(message: dq.Message, **kwargs: Any) -> None:
        attempts.append(message.attempt)
        Group.objects.create(name=f"effect-{message.id}")
        if message.attempt == 1:
            raise RuntimeError("after its write: rolled back")

    receivers(handler)
    dq.schedule(QUEUE, {}, id="m2")
    burst()
    assert attempts == [1, 2]
    assert Group.objects.filter(name="effect-m2").count() == 1  # the second attempt's only
    assert InboxEntry.objects.count() == 1
    assert [r[6] for r in journal_rows(redis_client)] == ["retry", "ack"]


def test_one_receiver_failing_rolls_back_the_other_receivers_work(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    def writes(message: dq.Message, **kwargs: Any) -> None:
        Group.objects.create(name=f"effect-{message.id}-{message.attempt}")

    def fails(message: dq.Message, **kwargs: Any) -> None:
        raise RuntimeError("always")

    receivers(writes)
    receivers(fails)
    dq.schedule(QUEUE, {}, id="m3")
    burst()
    assert not Group.objects.filter(name__startswith="effect-m3").exists()
    assert not InboxEntry.objects.exists()
    assert redis_client.zscore(KEYS.garbage, "m3") is not None  # dead-lettered as today


def test_a_delivery_whose_transaction_committed_before_is_acknowledged_without_running(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    """What a redelivery meets after its consumer died between the commit and the ack: the
    inbox row of its message (written here as that transaction would have)."""
    ran: list[str] = []
    receivers(lambda message, **kwargs: ran.append(message.id))
    dq.schedule(QUEUE, {}, id="m4")
    scheduled = get_queue(QUEUE).scheduled_times(["m4"])["m4"]
    InboxEntry.objects.create(queue=QUEUE, message_id="m4", scheduled_ms=scheduled)
    burst()
    assert ran == []
    assert gone(redis_client, "m4")
    rows = journal_rows(redis_client)
    assert [(r[6], r[7]) for r in rows] == [("ack", "AlreadyDone")]


def test_a_later_message_reusing_the_id_runs(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    keys: list[str] = []

    def handler(message: dq.Message, **kwargs: Any) -> None:
        keys.append(message.idempotency_key)
        Group.objects.create(name=f"effect-{len(keys)}")

    receivers(handler)
    dq.schedule(QUEUE, {}, id="again")
    burst()
    dq.schedule(QUEUE, {}, id="again")
    burst()
    assert Group.objects.count() == 2 and InboxEntry.objects.count() == 2
    assert len(set(keys)) == 2


def test_a_time_limit_rolls_back_what_the_handler_wrote(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    queues = dict(settings.DELAYQUEUE["QUEUES"])
    queues[QUEUE] = {**queues[QUEUE], "time_limit": 1, "max_attempts": 1}
    never = threading.Event()

    def handler(message: dq.Message, **kwargs: Any) -> None:
        Group.objects.create(name="stopped")
        while not never.wait(0.05):  # stopped by its time limit, raised between two waits
            pass

    receivers(handler)
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        dq.schedule(QUEUE, {}, id="m5")
        burst()
    assert not Group.objects.filter(name="stopped").exists()
    assert not InboxEntry.objects.exists()
    assert redis_client.zscore(KEYS.garbage, "m5") is not None


def test_a_bad_atomic_value_is_refused_naming_it() -> None:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"atomic": "nosuchdb"}}
    refused = pytest.raises(dq.ConfigurationError, match="'nosuchdb', which is not in DATABASES")
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}), refused:
        Worker.for_queues([QUEUE], burst=True)


def test_an_old_enough_inbox_row_is_pruned_once_its_message_is_gone(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    from django_delayqueue import inbox

    receivers(lambda message, **kwargs: None)
    dq.schedule(QUEUE, {}, id="done")
    burst()
    dq.schedule(QUEUE, {}, id="waiting", delay=3600)
    scheduled = get_queue(QUEUE).scheduled_times(["waiting"])["waiting"]
    InboxEntry.objects.create(queue=QUEUE, message_id="waiting", scheduled_ms=scheduled)
    q = get_queue(QUEUE)
    assert inbox.prune("default", [q], keep_seconds=3600) == 0  # too young, both
    assert inbox.prune("default", [q], keep_seconds=0) == 1  # "done": acked, gone
    assert list(InboxEntry.objects.values_list("message_id", flat=True)) == ["waiting"]


def test_schedule_in_an_atomic_handler_goes_through_the_outbox_in_its_transaction(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    """The next message of a chain exists if and only if this step's effects committed."""
    seen_rows: list[int] = []

    def handler(message: dq.Message, **kwargs: Any) -> None:
        dq.schedule(NEXT, {"after": message.id}, id=f"next-{message.attempt}", delay=60)
        seen_rows.append(OutboxMessage.objects.count())  # written in this transaction
        if message.attempt == 1:
            raise RuntimeError("rolled back: its next message with it")

    receivers(handler)
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OUTBOX": False}):
        dq.schedule(QUEUE, {}, id="step")
        burst()
    assert seen_rows == [1, 1]
    nxt = QueueKeys("dq", NEXT)
    assert redis_client.hget(nxt.messages, "next-1") is None
    assert redis_client.hget(nxt.messages, "next-2") is not None
    assert not OutboxMessage.objects.exists()  # sent after the commit, its row deleted


def test_the_idempotency_key_is_the_same_at_every_attempt(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    keys: list[str] = []

    def handler(message: dq.Message, **kwargs: Any) -> None:
        keys.append(message.idempotency_key)
        if message.attempt < 3:
            raise RuntimeError("again")

    receivers(handler)
    dq.schedule(QUEUE, {}, id="k")
    burst()
    assert len(keys) == 3 and len(set(keys)) == 1
    assert keys[0].startswith("dq-") and len(keys[0]) == 35


def _skipped_delivery(receivers: Callable[..., None]) -> None:
    """One delivery found already done on the atomic queue (its inbox row written first)."""
    receivers(lambda message, **kwargs: None)
    dq.schedule(QUEUE, {}, id="twice")
    scheduled = get_queue(QUEUE).scheduled_times(["twice"])["twice"]
    InboxEntry.objects.create(queue=QUEUE, message_id="twice", scheduled_ms=scheduled)
    dq.schedule(QUEUE, {}, id="once")
    burst()


def test_queuestats_and_the_admin_count_deliveries_skipped_as_already_done(
    redis_client: redis.Redis, receivers: Callable[..., None], admin_client: Any
) -> None:
    from io import StringIO

    from django.core.management import call_command

    _skipped_delivery(receivers)
    out = StringIO()
    call_command("queuestats", QUEUE, "--json", stdout=out)
    (stats,) = json.loads(out.getvalue())["queues"]
    assert stats["deliveries"] == 2 and stats["already_done"] == 1
    table = StringIO()
    call_command("queuestats", QUEUE, stdout=table)
    header, row = table.getvalue().splitlines()[:2]
    assert header.split()[-1] == "ALREADY_DONE" and row.split()[-1] == "1"
    response = admin_client.get(f"/admin/django_delayqueue/queuemessage/{QUEUE}/")
    assert response.status_code == 200
    assert "1 already done" in response.content.decode()


def test_the_checks_refuse_an_atomic_queue_on_a_database_without_transactions() -> None:
    from django_delayqueue.checks.atomic import check_atomic

    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUE: {"atomic": "nowhere"},
        NEXT: {"atomic": 1},
    }
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        errors = check_atomic()
    texts = sorted(e.msg for e in errors)
    assert {e.id for e in errors} == {"delayqueue.E019"}
    assert "must be True, False or a database alias" in texts[0] and "not in DATABASES" in texts[1]

    databases = {**settings.DATABASES, "plain": {"ENGINE": "django.db.backends.dummy"}}
    queues[QUEUE], queues[NEXT] = {"atomic": "plain"}, {}
    with override_settings(
        DATABASES=databases, DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}
    ):
        from django.db import connections

        connections.settings = connections.configure_settings(databases)
        try:
            (error,) = check_atomic()
        finally:
            connections.settings = connections.configure_settings(settings.DATABASES)
    assert error.id == "delayqueue.E019" and "'plain'" in error.msg


def test_a_missing_inbox_table_is_said_by_the_database_checks_and_stops_runqueue() -> None:
    from django.db import connection

    from django_delayqueue.checks.atomic import check_atomic_tables

    with connection.schema_editor() as editor:
        editor.delete_model(InboxEntry)
    try:
        (warning,) = check_atomic_tables(databases=["default"])
        assert warning.id == "delayqueue.W012" and "no inbox table" in warning.msg
        with pytest.raises(dq.ConfigurationError, match=r"run `python manage\.py migrate"):
            Worker.for_queues([QUEUE], burst=True)
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(InboxEntry)
    assert check_atomic_tables(databases=["default"]) == []


@pytest.fixture
def atomic_tasks() -> Iterator[Any]:
    """The demo's TASKS on its queue "shop-tasks", made atomic and retried at once."""
    from tests.settings import TASKS_SETTING

    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        "shop-tasks": {"atomic": True, "max_attempts": 3, "backoff_base": 0, "backoff_max": 0},
    }
    with override_settings(
        DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}, TASKS=TASKS_SETTING
    ):
        import task_examples

        yield task_examples


def test_a_task_on_an_atomic_queue_commits_only_the_attempt_that_returned(
    redis_client: redis.Redis, atomic_tasks: Any
) -> None:
    from django_delayqueue.tasks import framework

    result = atomic_tasks.writes_a_group.enqueue("task")
    Worker.for_queues(["shop-tasks"], burst=True).run()
    assert list(Group.objects.values_list("name", flat=True)) == ["task-2"]
    assert InboxEntry.objects.filter(queue="shop-tasks").count() == 1
    done = atomic_tasks.writes_a_group.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == "task"


def test_a_task_found_already_done_is_not_run_and_its_result_says_successful(
    redis_client: redis.Redis, atomic_tasks: Any
) -> None:
    from django_delayqueue.tasks import framework

    result = atomic_tasks.writes_a_group.enqueue("done")
    q = get_queue("shop-tasks", task=True)
    (message_id,) = redis_client.hkeys(QueueKeys("dq", "shop-tasks").messages)
    message_id = message_id.decode()
    scheduled = q.scheduled_times([message_id])[message_id]
    InboxEntry.objects.create(queue="shop-tasks", message_id=message_id, scheduled_ms=scheduled)
    Worker.for_queues(["shop-tasks"], burst=True).run()
    assert not Group.objects.exists()
    done = atomic_tasks.writes_a_group.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value is None
    rows = [
        r
        for _, f in redis_client.xrange(QueueKeys("dq", "shop-tasks").journal)
        for r in json.loads(f[b"o"])
    ]
    assert [(r[6], r[7]) for r in rows] == [("ack", "AlreadyDone")]


def test_an_aborted_delivery_is_rolled_back_even_when_its_handler_returns(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    """dq.abort sends the message to the dead letters whatever its handler does: a handler that
    stops cooperatively (returns) must leave nothing committed either."""
    started = threading.Event()

    def handler(message: dq.Message, **kwargs: Any) -> None:
        Group.objects.create(name="aborted")
        started.set()
        while not message.aborted:
            threading.Event().wait(0.02)

    receivers(handler)
    dq.schedule(QUEUE, {}, id="m6")
    worker = threading.Thread(target=burst)
    worker.start()
    assert started.wait(30)
    dq.abort(QUEUE, "m6", "staff said stop")
    worker.join(60)
    assert not worker.is_alive()
    assert not Group.objects.filter(name="aborted").exists()
    assert not InboxEntry.objects.exists()
    assert redis_client.zscore(KEYS.garbage, "m6") is not None


def test_a_worker_built_on_a_queue_that_is_not_configured_starts_and_is_not_atomic(
    redis_client: redis.Redis,
) -> None:
    from django_delayqueue.core import Queue

    worker = Worker([Queue(redis_client, "bare-queue")], burst=True)
    assert worker._atomic == {"bare-queue": None}


def test_the_workers_maintenance_prunes_the_inbox_of_its_atomic_queues(
    redis_client: redis.Redis, receivers: Callable[..., None]
) -> None:
    receivers(lambda message, **kwargs: None)
    dq.schedule(QUEUE, {}, id="pruned")
    dq.schedule(QUEUE, {}, id="later", delay=3600)
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "INBOX_KEEP_SECONDS": 0}):
        worker = burst()
        assert InboxEntry.objects.count() == 1
        worker._pruned_at = None  # the burst's own refresh came before the delivery
        worker.refresh()
    assert not InboxEntry.objects.exists()


def test_rows_kept_for_messages_still_in_redis_do_not_stop_the_pruning_of_later_rows(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oldest rows may all be kept for long (their messages dead-lettered after the commit,
    or on a paused queue): the next batch starts after them, not at them again."""
    from django_delayqueue import inbox

    monkeypatch.setattr(inbox, "PRUNE_BATCH", 2)
    q = get_queue(QUEUE)
    for message_id in ("kept-1", "kept-2"):
        dq.schedule(QUEUE, {}, id=message_id, delay=3600)
        scheduled = q.scheduled_times([message_id])[message_id]
        InboxEntry.objects.create(queue=QUEUE, message_id=message_id, scheduled_ms=scheduled)
    InboxEntry.objects.create(queue=QUEUE, message_id="acked", scheduled_ms=1)
    pruner = inbox.InboxPruner()
    assert pruner.prune("default", [q], keep_seconds=0) == 0  # the two kept rows
    assert pruner.behind  # a full batch: more may wait
    assert pruner.prune("default", [q], keep_seconds=0) == 1
    assert not pruner.behind
    assert sorted(InboxEntry.objects.values_list("message_id", flat=True)) == ["kept-1", "kept-2"]
    # Back at the oldest rows: their messages may have gone meanwhile.
    redis_client.hdel(KEYS.messages, "kept-1")
    assert pruner.prune("default", [q], keep_seconds=0) == 1


def test_a_worker_behind_on_its_inbox_prunes_again_at_its_next_maintenance(
    redis_client: redis.Redis, receivers: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue that commits more than a batch a minute: pruning once a minute would let its
    inbox grow for good; while a batch comes back full the next maintenance prunes again."""
    from django_delayqueue import inbox

    monkeypatch.setattr(inbox, "PRUNE_BATCH", 2)
    receivers(lambda message, **kwargs: None)
    for n in range(5):
        dq.schedule(QUEUE, {}, id=f"m{n}")
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "INBOX_KEEP_SECONDS": 0}):
        worker = burst()
        assert InboxEntry.objects.count() == 5
        worker._pruned_at = None  # the burst's own refresh came before the deliveries
        counts = []
        for _ in range(3):
            worker.refresh()
            counts.append(InboxEntry.objects.count())
        assert counts == [3, 1, 0]
        InboxEntry.objects.create(queue=QUEUE, message_id="acked", scheduled_ms=1)
        worker.refresh()  # caught up: the next prune waits its minute again
        assert InboxEntry.objects.count() == 1


def test_a_batch_that_fails_does_not_keep_the_worker_pruning_at_every_maintenance(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that fails while a pruner is behind: the failure is not "more rows may
    wait", so the worker waits its minute again rather than asking the database (and logging
    a warning) at every maintenance until it answers."""
    from unittest import mock

    from django.db import OperationalError, connections

    from django_delayqueue import inbox

    monkeypatch.setattr(inbox, "PRUNE_BATCH", 2)
    q = get_queue(QUEUE)
    for n in range(3):
        InboxEntry.objects.create(queue=QUEUE, message_id=f"acked-{n}", scheduled_ms=1)
    pruner = inbox.InboxPruner()
    assert pruner.prune("default", [q], keep_seconds=0) == 2
    assert pruner.behind
    down = OperationalError("connection to server failed")
    with mock.patch.object(connections["default"], "ensure_connection", side_effect=down):
        connections["default"].close()
        assert pruner.prune("default", [q], keep_seconds=0) == 0
    assert not pruner.behind
    assert pruner.prune("default", [q], keep_seconds=0) == 1  # from the oldest rows again
