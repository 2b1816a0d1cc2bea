"""Django's Tasks framework on django-delayqueue (``django_delayqueue.tasks.DelayQueueBackend``).

Against the session's real Redis: tasks are enqueued through the framework's own API
(``task.enqueue``, ``task.using(...)``, ``get_result``), run by a real ``Worker`` (in-process,
burst mode, where a test needs the signals a worker sends or retries at once) or by a real
``manage.py runqueue`` subprocess. The demo project's settings.TASKS names the backend, with
the queue "shop-tasks"; tests/support/task_examples.py holds the tasks.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from paths import child_pythonpath
from waiting import wait_until

from django_delayqueue.core import QueueKeys
from django_delayqueue.core.errors import PayloadError
from django_delayqueue.core.housekeeping import ENDED_RECORD_TTL_SECONDS
from django_delayqueue.tasks import framework
from django_delayqueue.worker import Worker

QUEUE = "shop-tasks"
KEYS = QueueKeys("dq", QUEUE)
ROOT = Path(__file__).resolve().parents[2]
Status = framework.TaskResultStatus


examples: Any = None  # tests/support/task_examples.py, imported once TASKS names the backend


@pytest.fixture(autouse=True)
def tasks_on_the_demo_queue() -> Iterator[None]:
    """The demo's TASKS (what DEMO_TASKS=1 turns on), its queue retried at once, so that one
    burst run goes through every attempt."""
    global examples
    from tests.settings import TASKS_SETTING

    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUE: {"max_attempts": 3, "backoff_base": 0, "backoff_max": 0},
    }
    delayqueue = {**settings.DELAYQUEUE, "QUEUES": queues}
    with override_settings(DELAYQUEUE=delayqueue, TASKS=TASKS_SETTING):
        import task_examples

        examples = task_examples
        yield


def burst(**kwargs: Any) -> Worker:
    worker = Worker.for_queues([QUEUE], burst=True, name="test-worker", **kwargs)
    worker.run()
    return worker


# --- the backend's contract -----------------------------------------------------------------


def test_the_backend_says_what_it_supports() -> None:
    backend = framework.task_backends["default"]
    assert type(backend).__name__ == "DelayQueueBackend"
    assert backend.supports_defer and backend.supports_get_result
    assert backend.supports_async_task and backend.supports_priority


@pytest.mark.django_db(transaction=True)
def test_a_backlog_due_at_once_starts_in_priority_order(redis_client: redis.Redis) -> None:
    past = datetime.now(dt_timezone.utc) - timedelta(
        minutes=5
    )  # all due already, from the same instant
    order = [(1, 0), (2, -20), (3, 100), (4, 5), (5, -100), (6, 5), (7, 0)]
    results = {n: examples.add.using(priority=p, run_after=past).enqueue(n, 0) for n, p in order}
    assert examples.add.get_result(results[3].id).task.priority == 100
    burst(concurrency=1)
    started = [int(line.split()[1]) for line in redis_client.lrange(examples.TRACE, 0, -1)]
    assert started == [3, 4, 6, 1, 7, 2, 5]  # higher first; the same priority oldest first
    assert all(
        examples.add.get_result(r.id).status == framework.SUCCESSFUL for r in results.values()
    )


def test_a_priority_out_of_range_is_refused_by_the_framework() -> None:
    with pytest.raises(framework.InvalidTask, match="priority"):
        examples.add.using(priority=101).enqueue(1, 1)


@pytest.mark.django_db(transaction=True)
def test_enqueue_then_a_worker_runs_it_and_the_result_says_so(redis_client: redis.Redis) -> None:
    result = examples.add.enqueue(2, 3)
    assert result.status == Status.READY and result.id
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.enqueued_at is not None and result.started_at is None
    stored = examples.add.get_result(result.id)
    assert stored.status == Status.READY and stored.enqueued_at == result.enqueued_at
    assert redis_client.ttl(KEYS.task_result(result.id)) == -1  # no expiry before it ran

    burst()

    done = examples.add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL
    assert done.return_value == 5
    assert done.worker_ids == ["test-worker"] and done.attempts == 1
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert done.last_attempted_at == done.started_at
    assert done.errors == []
    assert redis_client.lrange(examples.TRACE, 0, -1) == [b"add 2 3"]
    ttl = redis_client.ttl(KEYS.task_result(result.id))
    assert 0 < ttl <= framework.task_backends["default"].result_ttl
    assert redis_client.hlen(KEYS.messages) == 0  # acked

    result.refresh()
    assert result.status == framework.SUCCESSFUL and result.return_value == 5


@pytest.mark.django_db(transaction=True)
def test_a_record_read_just_before_the_ack_is_not_taken_for_a_lost_message(
    redis_client: redis.Redis,
) -> None:
    """get_result reads the record, then where its message is: a task that succeeds between
    the two reads (its record written with the ack, the message gone) must read SUCCESSFUL,
    never FAILED with "its message is gone" (seen once under load in CI)."""
    from django_delayqueue.tasks.reading import find_record, reconcile

    result = examples.add.enqueue(2, 3)
    found = find_record(result.id, [QUEUE])
    assert found is not None
    queue, stale = found
    stale.status = "RUNNING"  # as read while the worker ran it
    burst()  # it succeeds: the record is written with the ack, the message is gone
    assert redis_client.hlen(KEYS.messages) == 0

    reconcile(queue, result.id, stale)

    assert stale.status == "SUCCESSFUL" and stale.errors == [], stale.errors
    assert stale.return_value == 5


@pytest.mark.django_db(transaction=True)
def test_json_values_go_through_and_come_back(redis_client: redis.Redis) -> None:
    result = examples.returns_structure.enqueue("x", tags=("a", "b"))
    assert result.kwargs == {"tags": ["a", "b"]}  # a tuple becomes a list, as JSON gives it
    burst()
    assert examples.returns_structure.get_result(result.id).return_value == {
        "name": "x",
        "tags": ["a", "b"],
        "nested": [1, 2.5, None, True],
    }


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args, kwargs, problem",
    [
        ((object(),), {}, "argument 1 is not JSON-serialisable"),
        ((1,), {"b": datetime.now(dt_timezone.utc)}, "keyword argument 'b' is not JSON-seriali"),
        ((float("nan"), 1), {}, "argument 1 is not JSON-serialisable"),
        # What a worker could not decode, or Redis store (before: UnicodeEncodeError).
        ((1,), {"b": _nested(201)}, "keyword argument 'b' nests"),
        (("r\udcffport.pdf", 1), {}, "argument 1 holds a lone surrogate '\\udcff'"),
    ],
)
def test_arguments_that_are_not_json_are_refused_at_enqueue(
    redis_client: redis.Redis, args: tuple[Any, ...], kwargs: dict[str, Any], problem: str
) -> None:
    # django-tasks up to 0.8 normalises the arguments itself in Task.enqueue, before any
    # backend sees them: a TypeError there. Everywhere else the backend names the argument.
    with pytest.raises((PayloadError, TypeError)) as caught:
        examples.add.enqueue(*args, **kwargs)
    if isinstance(caught.value, PayloadError) or not _backport_normalises_arguments():
        assert isinstance(caught.value, PayloadError)
        assert problem in str(caught.value) and "task_examples.add" in str(caught.value)
    assert redis_client.keys("dq*shop-tasks*") == []  # nothing was written


def _backport_normalises_arguments() -> bool:
    import inspect

    return "json_normalize" in inspect.getsource(framework.Task.enqueue)


@pytest.mark.django_db  # the outbox is looked at too
def test_an_unknown_result_id_does_not_exist() -> None:
    with pytest.raises(framework.TaskResultDoesNotExist):
        examples.add.get_result("no-such-id")
    with pytest.raises(framework.TaskResultDoesNotExist):
        asyncio.run(examples.add.aget_result("no-such-id"))


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result(redis_client: redis.Redis) -> None:
    async def go() -> tuple[Any, Any]:
        result = await examples.add.aenqueue(1, 1)
        return result, await examples.add.aget_result(result.id)

    result, fetched = asyncio.run(go())
    assert fetched.id == result.id and fetched.status == Status.READY


# --- run_after ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_after_is_the_due_time_to_the_millisecond(redis_client: redis.Redis) -> None:
    when = datetime.now(dt_timezone.utc) + timedelta(hours=1, microseconds=1500)
    result = examples.add.using(run_after=when).enqueue(1, 2)
    due = redis_client.zscore(KEYS.pending, result.id)
    expected = math.ceil(
        (when - datetime(1970, 1, 1, tzinfo=dt_timezone.utc)) / timedelta(milliseconds=1)
    )
    assert due == expected  # rounded up: never early
    fetched = examples.add.get_result(result.id)
    assert fetched.task.run_after is not None
    assert abs(fetched.task.run_after - when) < timedelta(milliseconds=1)

    burst()  # not due: nothing runs
    assert examples.add.get_result(result.id).status == Status.READY
    assert redis_client.lrange(examples.TRACE, 0, -1) == []


@pytest.mark.django_db(transaction=True)
def test_run_after_accepts_a_timedelta(redis_client: redis.Redis) -> None:
    before = redis_client.time()
    result = examples.add.using(run_after=timedelta(minutes=10)).enqueue(1, 2)
    due = redis_client.zscore(KEYS.pending, result.id)
    server_ms = before[0] * 1000 + before[1] // 1000
    assert server_ms + 600_000 <= due < server_ms + 600_000 + 5_000


def test_a_naive_run_after_is_refused() -> None:
    with pytest.raises(framework.InvalidTask, match="aware"):
        examples.add.using(run_after=datetime(2030, 1, 1)).enqueue(1, 2)


def test_a_queue_that_is_not_a_delay_queue_is_refused() -> None:
    with pytest.raises(framework.InvalidTask):
        examples.add.using(queue_name="nowhere").enqueue(1, 2)


# --- failures and retries -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_between_attempts_the_result_is_ready_with_its_errors(redis_client: redis.Redis) -> None:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"max_attempts": 3, "backoff_base": 600}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        result = examples.always_fails.enqueue("x")
        burst()
    between = examples.always_fails.get_result(result.id)
    assert between.status == Status.READY
    assert len(between.errors) == 1
    assert between.errors[0].exception_class_path == "builtins.RuntimeError"
    assert "broken: x" in between.errors[0].traceback
    assert between.last_attempted_at is not None and between.finished_at is None
    assert redis_client.zscore(KEYS.retry, result.id) is not None
    assert redis_client.ttl(KEYS.task_result(result.id)) == -1


@pytest.mark.django_db(transaction=True)
def test_attempts_run_out_failed_with_every_error_and_a_dead_letter(
    redis_client: redis.Redis,
) -> None:
    result = examples.always_fails.enqueue("y")
    burst()
    failed = examples.always_fails.get_result(result.id)
    assert failed.status == Status.FAILED
    assert len(failed.errors) == 3 and failed.attempts == 3
    assert failed.finished_at is not None
    with pytest.raises(ValueError):
        failed.return_value  # noqa: B018 - the framework raises for a failed task
    assert redis_client.zscore(KEYS.garbage, result.id) is not None
    assert "RuntimeError: broken: y" in redis_client.hget(KEYS.reasons, result.id).decode()
    assert redis_client.ttl(KEYS.task_result(result.id)) > 0


@pytest.mark.django_db(transaction=True)
def test_a_task_that_fails_twice_then_succeeds_saw_its_errors(redis_client: redis.Redis) -> None:
    result = examples.fails_twice.enqueue()
    burst()
    done = examples.fails_twice.get_result(result.id)
    assert done.status == framework.SUCCESSFUL
    assert done.return_value == 3
    assert [e.exception_class_path for e in done.errors] == ["builtins.ValueError"] * 2
    assert done.worker_ids == ["test-worker"] * 3


@pytest.mark.django_db(transaction=True)
def test_a_base_exception_fails_the_attempt_not_the_worker(redis_client: redis.Redis) -> None:
    first = examples.exits.enqueue()
    second = examples.add.enqueue(4, 4)
    worker = burst()
    assert examples.exits.get_result(first.id).status == Status.FAILED
    assert (
        examples.exits.get_result(first.id).errors[0].exception_class_path == "builtins.SystemExit"
    )
    assert examples.add.get_result(second.id).return_value == 8
    assert worker.delivered >= 4


@pytest.mark.django_db(transaction=True)
def test_a_return_value_that_is_not_json_fails_the_task(redis_client: redis.Redis) -> None:
    result = examples.returns_a_set.enqueue()
    burst()
    failed = examples.returns_a_set.get_result(result.id)
    assert failed.status == Status.FAILED
    assert failed.errors[-1].exception_class_path == "builtins.TypeError"
    # Issue 37: in Python's words, which users (and django-tasks-db's suite) search for; the
    # framework's own ("Unsupported type", where it has one) is kept as the cause.
    traceback = failed.errors[-1].traceback
    assert "TypeError: Object of type set is not JSON serializable" in traceback
    if framework.normalize_json is not None:
        assert "Unsupported type: <class 'set'>" in traceback
    reason = redis_client.hget(KEYS.reasons, result.id) or b""
    assert b"is not JSON serializable" in reason


@pytest.mark.django_db(transaction=True)
def test_reject_fails_at_once_and_retry_is_not_an_error(redis_client: redis.Redis) -> None:
    rejected = examples.rejects.enqueue()
    retried = examples.asks_for_retry.using().enqueue(600)
    burst()
    failed = examples.rejects.get_result(rejected.id)
    assert failed.status == Status.FAILED and failed.attempts == 1
    assert "no longer exists" in redis_client.hget(KEYS.reasons, rejected.id).decode()
    waiting = examples.asks_for_retry.get_result(retried.id)
    assert waiting.status == Status.READY and waiting.errors == []
    assert redis_client.zscore(KEYS.retry, retried.id) is not None


@pytest.mark.django_db(transaction=True)
def test_a_requeued_dead_task_is_ready_again_and_runs(redis_client: redis.Redis) -> None:
    from django_delayqueue.conf.queues import get_queue

    result = examples.always_fails.enqueue("z")
    burst()
    assert examples.always_fails.get_result(result.id).status == Status.FAILED
    assert get_queue(QUEUE).requeue(result.id) == 1  # what the admin's "Requeue" does
    again = examples.always_fails.get_result(result.id)
    assert again.status == Status.READY
    burst()
    assert len(examples.always_fails.get_result(result.id).errors) == 6


# --- context, async, signals ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_takes_context_gets_its_task_context(redis_client: redis.Redis) -> None:
    result = examples.knows_its_context.enqueue("hello")
    burst()
    value = examples.knows_its_context.get_result(result.id).return_value
    assert value == {
        "label": "hello",
        "id": result.id,
        "attempt": 1,
        "errors": 0,
        "status": str(Status.RUNNING),
    }


@pytest.mark.django_db(transaction=True)
def test_an_async_task_runs_on_an_event_loop(redis_client: redis.Redis) -> None:
    result = examples.sleeps_async.enqueue("a")
    burst()
    assert examples.sleeps_async.get_result(result.id).return_value == "async a"
    trace = redis_client.lrange(examples.TRACE, 0, -1)
    assert trace and trace[0].startswith(b"async a ")


@pytest.mark.django_db(transaction=True)
def test_signals_are_sent_as_django_specifies(redis_client: redis.Redis) -> None:
    seen: list[tuple[str, Any, str]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, sender, str(task_result.status)))

        return receive

    receivers = {
        "enqueued": receiver("enqueued"),
        "started": receiver("started"),
        "finished": receiver("finished"),
    }
    framework.task_enqueued.connect(receivers["enqueued"])
    framework.task_started.connect(receivers["started"])
    framework.task_finished.connect(receivers["finished"])
    try:
        examples.add.enqueue(1, 1)
        examples.always_fails.enqueue("s")
        burst()
    finally:
        framework.task_enqueued.disconnect(receivers["enqueued"])
        framework.task_started.disconnect(receivers["started"])
        framework.task_finished.disconnect(receivers["finished"])
    backend = type(framework.task_backends["default"])
    assert all(sender is backend for _, sender, _ in seen)
    names = [(name, status) for name, _, status in seen]
    assert names.count(("enqueued", str(Status.READY))) == 2
    assert names.count(("started", str(Status.RUNNING))) == 4  # 1 + 3 attempts
    assert names.count(("finished", str(framework.SUCCESSFUL))) == 1
    assert names.count(("finished", str(Status.FAILED))) == 1  # only once: the last attempt


# --- on commit ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_task_is_sent_on_commit(redis_client: redis.Redis) -> None:
    with transaction.atomic():
        result = examples.add.enqueue(5, 5)
        assert result.id and result.status == Status.READY
        assert not redis_client.exists(KEYS.task_result(result.id))
        # Its outbox row, in this very transaction, tells its result (DELAYQUEUE['OUTBOX']).
        assert examples.add.get_result(result.id).status == Status.READY
    assert redis_client.exists(KEYS.task_result(result.id))
    assert examples.add.get_result(result.id).status == Status.READY


@pytest.mark.django_db(transaction=True)
def test_without_the_outbox_a_task_is_unknown_until_the_commit(redis_client: redis.Redis) -> None:
    off = override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OUTBOX": False})
    with off, transaction.atomic():
        result = examples.add.enqueue(5, 5)
        with pytest.raises(framework.TaskResultDoesNotExist):
            examples.add.get_result(result.id)
    assert examples.add.get_result(result.id).status == Status.READY


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_sends_nothing(redis_client: redis.Redis) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        result = examples.add.enqueue(6, 6)
        raise RuntimeError("rollback")
    with pytest.raises(framework.TaskResultDoesNotExist):
        examples.add.get_result(result.id)
    assert redis_client.hlen(KEYS.messages) == 0


@pytest.mark.django_db(transaction=True)
def test_on_commit_false_sends_at_once(redis_client: redis.Redis) -> None:
    from django_delayqueue.tasks.backend import DelayQueueBackend

    params = {**settings.TASKS["default"], "OPTIONS": {"ON_COMMIT": False}}
    assert DelayQueueBackend("default", params).on_commit is False
    assert DelayQueueBackend("default", {**params, "OPTIONS": {}}).on_commit is True
    # Not override_settings: django-tasks 0.8 keeps its backends when TASKS changes.
    backend = framework.task_backends["default"]
    backend.on_commit = False
    try:
        with transaction.atomic():
            result = examples.add.enqueue(7, 7)
            assert examples.add.get_result(result.id).status == Status.READY
    finally:
        backend.on_commit = True


# --- runqueue ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_runqueue_runs_tasks_and_signal_messages_together(
    redis_client: redis.Redis, redis_server: Any, tmp_path: Path
) -> None:
    import django_delayqueue as dq

    sync_task = examples.add.enqueue(20, 22)
    async_task = examples.sleeps_async.enqueue("from runqueue")
    context_task = examples.knows_its_context.enqueue("ctx")
    dq.schedule("order-close", {"order_id": 999_999})  # a signal message beside them
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REDIS_URL": redis_server.url,
        "PYTHONPATH": child_pythonpath(),
        "DEMO_DB": str(tmp_path / "db.sqlite3"),
        "DEMO_TASKS": "1",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, timeout=120, cwd=ROOT)
    done = subprocess.run(
        [*manage, "runqueue", "--burst", "--name", "rq-1"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert examples.add.get_result(sync_task.id).return_value == 42
    assert examples.sleeps_async.get_result(async_task.id).return_value == "async from runqueue"
    ctx = examples.knows_its_context.get_result(context_task.id)
    assert ctx.return_value["id"] == context_task.id and ctx.worker_ids == ["rq-1"]
    order_close = QueueKeys("dq", "order-close")
    assert redis_client.hlen(order_close.messages) == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_ids_list_the_name_runqueue_was_given_under_its_supervisor(
    redis_client: redis.Redis, redis_server: Any, tmp_path: Path
) -> None:
    """Issue 37: with ``runqueue --name X`` (its consumer processes under a supervisor, named
    ``X.<slot>-<pid>`` in heartbeats and logs) a task's worker_ids read ``X.1-<pid>``: users
    of --name look for the name they gave, as django-tasks-db's ``--worker-id`` gives it."""
    results = [examples.add.enqueue(n, 1) for n in range(4)]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REDIS_URL": redis_server.url,
        "PYTHONPATH": child_pythonpath(),
        "DEMO_DB": str(tmp_path / "db.sqlite3"),
        "DEMO_TASKS": "1",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, timeout=120, cwd=ROOT)
    log = tmp_path / "runqueue.log"
    with log.open("wb") as out:
        runqueue = subprocess.Popen(
            [*manage, "runqueue", QUEUE, "--name", "shop-workers", "--processes", "2"],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        wait_until(
            lambda: all(
                examples.add.get_result(r.id).status == framework.SUCCESSFUL for r in results
            ),
            60,
            "the tasks done",
            details=log.read_text,
        )
    finally:
        runqueue.terminate()
        assert runqueue.wait(60) == 0, log.read_text()[-3000:]
    for r in results:
        assert examples.add.get_result(r.id).worker_ids == ["shop-workers"]
    # Each process keeps its own name where one process is meant: its log lines.
    assert re.search(r"shop-workers\.[12]-\d+ consuming shop-tasks", log.read_text())


# --- the admin -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_queue_page_shows_tasks_with_their_results(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    from admin_support import action_url, page

    dead = examples.always_fails.enqueue("admin")
    burst()
    waiting = examples.add.using(run_after=timedelta(hours=1)).enqueue(2, 3)
    waiting_kw = examples.returns_structure.using(run_after=timedelta(hours=1)).enqueue(
        "n", tags=["t"]
    )

    pending = admin_client.get(page(QUEUE, "pending")).content.decode()
    assert "add(2, 3)" in pending and waiting.id in pending
    assert "returns_structure(&quot;n&quot;, tags=[&quot;t&quot;])" in pending
    assert "READY" in pending and "Task result" in pending

    garbage = admin_client.get(page(QUEUE, "garbage")).content.decode()
    assert "always_fails(&quot;admin&quot;)" in garbage
    assert "FAILED — 3 errors, last <code>builtins.RuntimeError</code>" in garbage

    # The same actions as any message: a requeue makes the task READY again.
    response = admin_client.post(action_url("requeue", QUEUE), {"ids": [dead.id]})
    assert response.status_code == 302
    assert examples.always_fails.get_result(dead.id).status == Status.READY
    assert waiting_kw.id in pending


@pytest.mark.django_db(transaction=True)
def test_a_signal_queue_page_has_no_task_column(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    from admin_support import page

    import django_delayqueue as dq

    dq.schedule("order-close", {"order_id": 1}, delay=600)
    content = admin_client.get(page("order-close", "pending")).content.decode()
    assert "Task result" not in content and "order_id" in content


# --- review fixes: what a task message may and may not do -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_signal_queue_never_runs_a_payload_shaped_like_a_task(
    redis_client: redis.Redis,
) -> None:
    import django_delayqueue as dq

    seen: list[Any] = []

    def receiver(sender: str, message: Any, **kwargs: Any) -> None:
        seen.append(message.payload)

    dq.topic("order-close").connect(receiver, weak=False)
    try:
        dq.schedule("order-close", {"django.task": "task_examples.add", "args": [40, 2]})
        Worker.for_queues(["order-close"], burst=True).run()
    finally:
        dq.topic("order-close").disconnect(receiver)
    assert redis_client.lrange(examples.TRACE, 0, -1) == []  # the task was not imported or run
    assert seen and seen[0]["django.task"] == "task_examples.add"  # the receivers got it


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_reads_failed_not_ready_for_ever(redis_client: redis.Redis) -> None:
    import django_delayqueue as dq

    result = examples.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    assert dq.cancel(QUEUE, result.id)
    assert examples.add.get_result(result.id).status == Status.FAILED
    # Kept as long as a finished task's, then gone: never a record for ever.
    assert 0 < redis_client.ttl(KEYS.task_result(result.id)) <= ENDED_RECORD_TTL_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_purged_dead_task_keeps_its_failed_result_for_a_while_not_for_ever(
    redis_client: redis.Redis,
) -> None:
    from django_delayqueue.conf.queues import get_queue

    result = examples.add.enqueue(1, 2)
    queue = get_queue(QUEUE)
    (delivery,) = queue.claim(1)
    queue.bury(delivery, "its consumer died on the last attempt")  # as a reap would
    assert redis_client.ttl(KEYS.task_result(result.id)) == -1  # requeue may still revive it
    assert queue.purge() == 1
    assert examples.add.get_result(result.id).status == Status.FAILED
    assert 0 < redis_client.ttl(KEYS.task_result(result.id)) <= ENDED_RECORD_TTL_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_task_that_cannot_be_imported_is_retried_not_dead_at_once(
    redis_client: redis.Redis,
) -> None:
    """A worker deployed before the code that enqueued the task: it may import on a retry."""
    from django_delayqueue.conf.queues import get_queue
    from django_delayqueue.tasks.payload import TaskRecord, task_payload

    queue = get_queue(QUEUE)
    path = "task_examples.not_deployed_yet"
    prepared = queue.prepare(task_payload(path, [], {}, "default"), id="early")
    enqueued = TaskRecord(path, QUEUE, 0, "default", [], {}, enqueued_at=prepared.due_ms)
    queue.send_with_record(prepared, KEYS.task_result("early"), enqueued.enqueued_json())
    burst()
    assert redis_client.hget(KEYS.attempts, "early") == b"3"  # every attempt was made
    stored = TaskRecord.from_hash(redis_client.hgetall(KEYS.task_result("early")))
    assert stored.status == "FAILED" and len(stored.errors) == 3
    assert all("ImportError" in e["traceback"] for e in stored.errors)
    assert redis_client.zscore(KEYS.garbage, "early") is not None


@pytest.mark.parametrize("levels", [5_000, 201])
@pytest.mark.django_db(transaction=True)
def test_a_return_value_nested_too_deep_to_store_fails_once_with_the_error_recorded(
    redis_client: redis.Redis, levels: int
) -> None:
    # Before: 5000 levels raised RecursionError, so the task ran max_attempts (3) times; 201
    # were stored, for a reader with a deeper stack to fail on (as a consumer did on payloads).
    result = examples.returns_nested.enqueue(levels)
    burst()
    assert redis_client.lrange(examples.TRACE, 0, -1) == [f"returns_nested {levels}".encode()]
    failed = examples.returns_nested.get_result(result.id)
    assert failed.status == Status.FAILED and failed.attempts == 1
    assert len(failed.errors) == 1
    assert failed.errors[0].exception_class_path == "django_delayqueue.core.errors.PayloadError"
    assert "return value nests arrays and objects more than 200" in failed.errors[0].traceback
    reason = (redis_client.hget(KEYS.reasons, result.id) or b"").decode()
    assert reason.startswith("task ran, but its result cannot be stored: return value nests")


@pytest.mark.django_db(transaction=True)
def test_a_return_value_holding_a_lone_surrogate_is_stored_escaped(
    redis_client: redis.Redis,
) -> None:
    # Unlike a payload (refused: not UTF-8), a return value keeps it as an ASCII escape.
    result = examples.returns_a_file_name.enqueue()
    burst()
    done = examples.returns_a_file_name.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.return_value == "r\udcffport.pdf"


@pytest.mark.django_db(transaction=True)
def test_a_non_json_return_value_fails_once_without_running_again(
    redis_client: redis.Redis,
) -> None:
    result = examples.returns_a_set.enqueue()
    burst()
    failed = examples.returns_a_set.get_result(result.id)
    assert failed.status == Status.FAILED and failed.attempts == 1
    assert redis_client.zscore(KEYS.garbage, result.id) is not None


@pytest.mark.django_db(transaction=True)
def test_a_raising_signal_receiver_changes_nothing_of_the_task(
    redis_client: redis.Redis,
) -> None:
    def broken(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise RuntimeError("a receiver's bug")

    framework.task_started.connect(broken)
    framework.task_finished.connect(broken)
    try:
        result = examples.add.enqueue(2, 2)
        burst()
    finally:
        framework.task_started.disconnect(broken)
        framework.task_finished.disconnect(broken)
    done = examples.add.get_result(result.id)
    assert done.status == framework.SUCCESSFUL and done.attempts == 1
    assert redis_client.lrange(examples.TRACE, 0, -1) == [b"add 2 2"]  # ran once
    assert redis_client.zscore(KEYS.garbage, result.id) is None


@pytest.mark.django_db(transaction=True)
def test_inside_task_finished_a_failed_task_reads_failed(redis_client: redis.Redis) -> None:
    seen: list[str] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(str(examples.always_fails.get_result(task_result.id).status))

    framework.task_finished.connect(receiver)
    try:
        examples.always_fails.enqueue("f")
        burst()
    finally:
        framework.task_finished.disconnect(receiver)
    assert seen == [str(Status.FAILED)]  # not READY: its message is in flight, not requeued


@pytest.mark.django_db(transaction=True)
def test_inside_task_finished_a_successful_task_reads_successful(
    redis_client: redis.Redis,
) -> None:
    """Its result is written with the message's ack; the signal waits for it."""
    seen: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        stored = examples.add.get_result(task_result.id)
        seen.append(
            (
                str(stored.status),
                stored.return_value,
                redis_client.hexists(KEYS.messages, task_result.id),
            )
        )

    framework.task_finished.connect(receiver)
    try:
        examples.add.enqueue(4, 5)
        burst()
    finally:
        framework.task_finished.disconnect(receiver)
    assert seen == [(str(framework.SUCCESSFUL), 9, False)]  # and its message acked with it


@pytest.mark.django_db(transaction=True)
def test_while_it_runs_get_result_says_running(redis_client: redis.Redis) -> None:
    result = examples.reads_its_own_result.enqueue()
    burst()
    done = examples.reads_its_own_result.get_result(result.id)
    assert done.return_value == str(Status.RUNNING)
    assert done.status == framework.SUCCESSFUL and done.started_at is not None


@pytest.mark.django_db(transaction=True)
def test_runqueue_imports_the_tasks_modules_of_installed_apps_before_the_first_task(
    redis_client: redis.Redis,
) -> None:
    sys.modules.pop("demo_project.shop.tasks", None)
    burst()  # nothing to run
    assert "demo_project.shop.tasks" in sys.modules


@pytest.mark.django_db(transaction=True)
def test_a_naive_run_after_works_without_time_zones(redis_client: redis.Redis) -> None:
    with override_settings(USE_TZ=False):
        naive = datetime(2030, 1, 1, 12, 0, 0)
        result = examples.add.using(run_after=naive).enqueue(1, 2)
    aware = datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt_timezone.utc)  # TIME_ZONE is UTC here
    epoch = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
    assert redis_client.zscore(KEYS.pending, result.id) == (aware - epoch) // timedelta(
        milliseconds=1
    )


def test_manage_py_check_reports_the_backends_own_errors(tmp_path: Path) -> None:
    """E005 through ``manage.py check`` itself, in a project that imports no task module."""
    (tmp_path / "bad_tasks_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "TASKS = {'default': {**TASKS_SETTING['default'], 'OPTIONS': {'RESULT_TTL': -1}}}\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bad_tasks_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DEMO_DB": str(tmp_path / "db.sqlite3"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.count("delayqueue.E005") == 1, done.stderr  # reported, and only once


@pytest.mark.django_db(transaction=True)
def test_tasks_on_a_sharded_queue_run_as_the_queue_s_own(redis_client: redis.Redis) -> None:
    """Each task lands on its id's shard; the worker, its signals and the rebuilt record name the
    logical queue, never a shard (before: "shop-tasks#1" reached TaskContext and the record)."""
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"shards": 3, "backoff_base": 0}}
    seen: list[str] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result.task.queue_name)

    framework.task_started.connect(started)
    try:
        with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
            # 30 ids: all on one of 3 shards by chance is 3 in 3**30, where 6 made it 1 in 243.
            results = [examples.add.enqueue(n, 1) for n in range(30)]
            shards = {
                int(key.decode().split("#")[1].split("}")[0])
                for key in redis_client.keys("{dq:shop-tasks#*}:task:*")
            }
            assert len(shards) >= 2  # spread over the shards
            lost = results[0].id  # a record lost before the run is rebuilt from the message
            redis_client.delete(*redis_client.keys("{dq:shop-tasks#*}:task:" + lost))
            burst()
            for r in results:
                done = examples.add.get_result(r.id)
                assert done.status == framework.SUCCESSFUL
                assert done.task.queue_name == QUEUE
    finally:
        framework.task_started.disconnect(started)
    assert seen and set(seen) == {QUEUE}


def test_a_changed_tasks_setting_builds_its_backend_anew() -> None:
    """override_settings(TASKS=...) reaches the backend even where the framework does not
    forget it by itself (the backport up to 0.8 without "django_tasks" in INSTALLED_APPS)."""
    from tests.settings import TASKS_SETTING

    first = framework.task_backends["default"]
    other = {"default": {**TASKS_SETTING["default"], "QUEUES": ["another-queue"]}}
    with override_settings(TASKS=other):
        assert framework.task_backends["default"].queues == {"another-queue"}
    assert framework.task_backends["default"].queues == first.queues
