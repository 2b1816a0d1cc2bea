"""What a task's enqueue and run ask for every time, kept where the answer cannot change
(issue 37: the Tasks path delivered 0.43x the signal path). Each kept answer is checked to
follow what it depends on. Against the session's real Redis, on the demo's task queue (the
fixture of test_tasks_backend).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from test_tasks_backend import QUEUE, tasks_on_the_demo_queue  # noqa: F401

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.tasks import framework, runner


def examples() -> Any:
    import task_examples

    return task_examples


def run_all(task: Any, calls: list[tuple[Any, ...]], asked: list[str]) -> list[str]:
    """Enqueue ``task`` once per arguments, then run their deliveries in this thread; their
    messages' ids. ``asked`` keeps only the lookups the runs made."""
    ids = [task.enqueue(*args).id for args in calls]
    del asked[:]
    q = get_queue(QUEUE)
    for delivery in q.claim(len(calls)):
        writes = runner.TaskRunner("w1").run(delivery, q)
        writes.call.run(q.client)
    return ids


def count_backend_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The aliases the task backends' handler is asked for from now on (in this test)."""
    asked: list[str] = []
    lookup = type(framework.task_backends).__getitem__

    def counted(self: Any, alias: str) -> Any:
        asked.append(alias)
        return lookup(self, alias)

    monkeypatch.setattr(type(framework.task_backends), "__getitem__", counted)
    return asked


def test_a_worker_asks_for_a_task_s_backend_once_until_tasks_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = count_backend_lookups(monkeypatch)
    add = examples().add
    run_all(add, [(1, 2), (3, 4)], asked)
    assert asked == ["default"]  # the second run is told by the first's answer
    from tests.settings import TASKS_SETTING

    changed = {"default": {**TASKS_SETTING["default"], "OPTIONS": {"RESULT_TTL": 60}}}
    with override_settings(TASKS=changed):
        [message_id] = run_all(add, [(5, 6)], asked)
        assert asked == ["default"]  # the new TASKS' backend, looked up again
        ttl = get_queue(QUEUE).client.ttl(get_queue(QUEUE).keys.task_result(message_id))
        assert 0 < ttl <= 60  # its RESULT_TTL, not the week the one before kept results


def test_a_worker_follows_a_backend_removed_or_replaced_in_the_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``del task_backends[alias]`` (or an assignment) changes the handler's backends without
    a ``setting_changed``: the kept answer must not outlive it."""
    from django_delayqueue.tasks import DelayQueueBackend
    from tests.settings import TASKS_SETTING

    handler = framework.task_backends
    asked = count_backend_lookups(monkeypatch)
    add = examples().add
    run_all(add, [(1, 2)], asked)
    old = framework.backend_named("default")
    del handler["default"]
    run_all(add, [(3, 4)], asked)
    assert asked == ["default"]  # looked up again: the handler built a new one
    assert framework.backend_named("default") is not old
    assert framework.backend_named("default") is handler["default"]
    params = {**TASKS_SETTING["default"], "OPTIONS": {"RESULT_TTL": 60}}
    handler["default"] = DelayQueueBackend(alias="default", params=params)
    try:
        [message_id] = run_all(add, [(5, 6)], asked)
        ttl = get_queue(QUEUE).client.ttl(get_queue(QUEUE).keys.task_result(message_id))
        assert 0 < ttl <= 60  # the backend put in its place, not the one kept before
    finally:
        del handler["default"]


def test_plain_arguments_are_encoded_once_and_come_back_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_delayqueue.tasks import backend

    encoded: list[Any] = []
    encode = backend.encode_payload

    def counted(value: Any, *args: Any) -> str:
        encoded.append(value)
        return encode(value, *args)

    monkeypatch.setattr(backend, "encode_payload", counted)
    task = examples().add
    args, kwargs = backend._json_arguments(task, (1, "é", None, 2.5, True), {"k": "v"})
    assert (args, kwargs) == ([1, "é", None, 2.5, True], {"k": "v"})
    assert len(encoded) == 1  # all of them at once, not each again, nor decoded back
    # What JSON refuses still names its argument (the long way round).
    with pytest.raises(backend.TaskArgumentError, match="argument 2"):
        backend._json_arguments(task, (1, float("nan")), {})
    with pytest.raises(backend.PayloadError, match=r"argument 1 .*surrogate"):
        backend._json_arguments(task, ("\udcff",), {})
    # A tuple or a list goes the long way too: normalised as the framework does it.
    assert backend._json_arguments(task, ((1, 2),), {"t": [3]}) == ([[1, 2]], {"t": [3]})


def test_a_schedule_s_debug_line_costs_nothing_when_debug_is_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django_delayqueue.outbox import committing

    built: list[str] = []
    fields = committing.id_fields

    def counted(queue: str, message_id: str) -> Any:
        built.append(message_id)
        return fields(queue, message_id)

    monkeypatch.setattr(committing, "id_fields", counted)
    caplog.set_level("INFO", logger="django_delayqueue.api")
    examples().add.enqueue(1, 2)
    assert built == []  # nothing built for a line nobody logs
    caplog.set_level("DEBUG", logger="django_delayqueue.api")
    result = examples().add.enqueue(3, 4)
    assert built == [result.id]
    assert any(result.id in r.getMessage() for r in caplog.records)


def test_a_worker_s_run_keeps_the_heap_it_started_with_out_of_the_collector_s_sweeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from django_delayqueue.worker import Worker

    seen: list[int] = []

    def run(self: Any) -> int:
        seen.append(gc.get_freeze_count())
        return 0

    monkeypatch.setattr(Worker, "_run", run)
    before = gc.get_freeze_count()
    assert Worker.for_queues([QUEUE], burst=True).run() == 0
    assert seen[0] > before  # frozen while it ran
    assert gc.get_freeze_count() < seen[0]  # and given back to the collector after


@pytest.mark.django_db(transaction=True)  # task_finished's send closes old connections
def test_a_run_copies_its_task_with_the_record_s_options_only_for_what_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delay queue's tasks each have a run_after of their own, so the copy of the Task with
    the record's options was made anew for every run. A quiet run (no TaskResult built, the
    framework's own call) makes none; a heard one still names every option."""
    from datetime import datetime, timedelta, timezone

    copies: list[Any] = []
    as_enqueued = runner.task_as_enqueued

    def counted(task: Any, record: Any) -> Any:
        copies.append(record.run_after)
        return as_enqueued(task, record)

    def run_one(task: Any, *args: Any) -> str:
        message_id = task.enqueue(*args).id
        q = get_queue(QUEUE)
        (delivery,) = q.claim(1)
        writes = runner.TaskRunner("w1").run(delivery, q)
        writes.call.run(q.client)
        assert writes.then is not None
        writes.then()  # task_finished, as the consumer sends it once Redis has the result
        return message_id

    monkeypatch.setattr(runner, "task_as_enqueued", counted)
    due = datetime.now(timezone.utc) - timedelta(seconds=5)
    due = due.replace(microsecond=due.microsecond // 1000 * 1000)  # whole ms, as stored
    add = examples().add.using(run_after=due, priority=3)
    # Quiet: only the framework's receivers, and their lines dropped (see unheard).
    monkeypatch.setattr(runner, "unheard_quiet", lambda *args: True)
    monkeypatch.setattr(runner, "unheard", lambda *args: True)
    run_one(add, 1, 2)
    assert copies == []  # nothing read the options
    monkeypatch.setattr(runner, "unheard_quiet", lambda *args: False)
    monkeypatch.setattr(runner, "unheard", lambda *args: False)
    heard: list[Any] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(task_result)

    framework.task_finished.connect(on_finished)
    try:
        message_id = run_one(add, 3, 4)
    finally:
        framework.task_finished.disconnect(on_finished)
    (result,) = heard
    assert result.id == message_id and result.return_value == 7
    assert (result.task.run_after, result.task.priority) == (due, 3)
    assert result.task.queue_name == QUEUE and result.task.func is add.func
    assert len(copies) == 1  # built once for both signals' TaskResults
