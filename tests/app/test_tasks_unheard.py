"""task_started and task_finished not built when sending them would do nothing
(django_delayqueue.tasks.unheard): the framework's own receivers are their only ones, and the
line they log is dropped, as under Django's default logging with ``DEBUG = False``. Whatever
else is connected or configured, they are sent as before. Against the session's real Redis,
on the demo's task queue (the fixture of test_tasks_backend).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from django.utils.log import AdminEmailHandler, RequireDebugTrue
from test_tasks_backend import QUEUE, tasks_on_the_demo_queue  # noqa: F401

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.tasks import framework, runner
from django_delayqueue.tasks.payload import RUNNING, SUCCESSFUL
from django_delayqueue.tasks.unheard import dropped, unheard

Status = framework.TaskResultStatus
# The lowest django-tasks version setup.cfg allows logs no task signals: there is nothing to
# skip (every send goes out, as tests/app/test_tasks_backend.py checks); the newest backport and
# Django 6.1 run these tests.
NO_LOGGING_RECEIVERS = "this Tasks framework has no logging receivers of its task signals"


def examples() -> Any:
    import task_examples

    return task_examples


def django_default_shape(log: logging.Logger, console: io.StringIO) -> None:
    """``log`` handled as Django's DEFAULT_LOGGING handles "django": INFO, a console handler
    that passes records only with DEBUG on, the admins' mail for ERROR; not propagated (so
    that pytest's own capture handler on the root is not among them)."""
    stream = logging.StreamHandler(console)
    stream.setLevel(logging.INFO)
    stream.addFilter(RequireDebugTrue())
    mail = AdminEmailHandler()
    mail.setLevel(logging.ERROR)
    log.handlers, log.filters, log.propagate = [stream, mail], [], False
    log.setLevel(logging.INFO)


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    """The framework's logger shaped as Django's default logging; what its console prints.
    Shaped again at the start of each test's body (``shaped``): pytest adds its capture
    handlers to it as the test's call begins."""
    if framework.signals_logger is None:
        pytest.skip(NO_LOGGING_RECEIVERS)
    log = framework.signals_logger
    kept = (log.handlers, log.filters, log.propagate, log.level)
    console = io.StringIO()
    django_default_shape(log, console)
    try:
        yield console
    finally:
        log.handlers, log.filters, log.propagate = kept[:3]
        log.setLevel(kept[3])


def shaped(console: io.StringIO) -> logging.Logger:
    django_default_shape(framework.signals_logger, console)
    return framework.signals_logger


def run_and_finish(task: Any, *args: Any) -> list[Any]:
    """Run one delivery of ``task`` on the demo queue to its end (its task_finished sent);
    returns the TaskResults the run built."""
    task.enqueue(*args)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    built: list[Any] = []
    build = runner.to_task_result

    def counted(*a: Any, **kw: Any) -> Any:
        built.append(build(*a, **kw))
        return built[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "to_task_result", counted)
        try:
            writes = runner.TaskRunner("w1").run(delivery, q)
        except BaseException:
            return built
        writes.call.run(q.client)
        assert writes.then is not None
        writes.then()
    return built


def states(console: str) -> list[str]:
    return [line.rsplit("=", 1)[-1] for line in console.splitlines() if "Task id=" in line]


# --- the logging a send would do ------------------------------------------------------------


def test_django_s_default_logging_drops_info_without_debug(console: io.StringIO) -> None:
    log = shaped(console)
    assert log.isEnabledFor(logging.INFO)  # enabled: the record would be built, then dropped
    assert dropped(log, logging.INFO)
    with override_settings(DEBUG=True):
        assert not dropped(log, logging.INFO)  # the console prints it
    assert not dropped(log, logging.ERROR)  # the admins' mail takes it


def test_anything_of_the_user_s_on_the_way_means_the_record_is_made(
    console: io.StringIO,
) -> None:
    log = shaped(console)
    log.addFilter(lambda record: True)  # a filter may count, or change the record
    assert not dropped(log, logging.INFO)
    log.filters = []
    log.handlers.append(logging.StreamHandler(io.StringIO()))
    assert not dropped(log, logging.INFO)
    log.handlers[-1].setLevel(logging.WARNING)  # above INFO: never called
    assert dropped(log, logging.INFO)
    log.handlers[0].filters.insert(0, lambda record: True)  # before RequireDebugTrue: it runs
    assert not dropped(log, logging.INFO)
    log.handlers[0].filters.pop(0)
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *a, **kw: factory(*a, **kw))
    try:
        assert not dropped(log, logging.INFO)
    finally:
        logging.setLogRecordFactory(factory)
    log.setLevel(logging.WARNING)
    assert dropped(log, logging.INFO)  # not enabled at all


# --- a task's run ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_builds_no_result_when_its_log_lines_would_be_dropped(
    console: io.StringIO,
) -> None:
    shaped(console)
    backend = framework.task_backends["default"]
    assert unheard(framework.task_started, backend, RUNNING)
    assert unheard(framework.task_finished, backend, SUCCESSFUL)
    assert run_and_finish(examples().add, 1, 2) == []
    assert console.getvalue() == ""


@pytest.mark.django_db(transaction=True)
def test_with_debug_on_the_same_logging_prints_both_lines(console: io.StringIO) -> None:
    shaped(console)
    with override_settings(DEBUG=True):
        built = run_and_finish(examples().add, 1, 2)
    assert states(console.getvalue()) == [str(Status.RUNNING), str(framework.SUCCESSFUL)]
    assert len(built) == 1  # the started one; the finished one is its copy


@pytest.mark.django_db(transaction=True)
def test_a_failed_task_s_error_line_is_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    if framework.signals_logger is None:
        pytest.skip(NO_LOGGING_RECEIVERS)
    caplog.set_level(logging.WARNING, logger=framework.signals_logger.name)
    built = run_and_finish(examples().rejects)
    assert [r.status for r in built] == [Status.FAILED]
    (line,) = [r for r in caplog.records if "Task id=" in r.msg]
    assert line.levelno == logging.ERROR


@pytest.mark.django_db(transaction=True)
def test_a_receiver_of_the_user_s_gets_both_signals_whatever_the_logging(
    console: io.StringIO,
) -> None:
    shaped(console)
    heard: list[tuple[str, Any]] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(("started", task_result))

    async def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(("finished", task_result))  # an async receiver counts too

    framework.task_started.connect(on_started)
    framework.task_finished.connect(on_finished)
    try:
        built = run_and_finish(examples().add, 2, 5)
    finally:
        framework.task_started.disconnect(on_started)
        framework.task_finished.disconnect(on_finished)
    assert [(what, r.status) for what, r in heard] == [
        ("started", Status.RUNNING),
        ("finished", framework.SUCCESSFUL),
    ]
    assert heard[1][1].return_value == 7 and heard[1][1].worker_ids == ["w1"]
    assert heard[0][1] is built[0]


@pytest.mark.django_db(transaction=True)
def test_a_context_task_gets_its_result_when_no_signal_is_sent(console: io.StringIO) -> None:
    shaped(console)
    built = run_and_finish(examples().knows_its_context, "x")
    assert [r.status for r in built] == [Status.RUNNING]
    assert built[0].task.module_path.endswith("knows_its_context")


# --- the receivers' answer, kept while they stay the same (unheard._only_own_receiver) -----


@pytest.mark.django_db(transaction=True)
def test_a_receiver_connected_after_a_quiet_run_is_called_then_left_after_disconnecting(
    console: io.StringIO,
) -> None:
    """The answer "only the framework's receiver" is kept after the first run; a receiver
    connected later is called by the next run, and one disconnected is not sent to again."""
    shaped(console)
    assert run_and_finish(examples().add, 1, 2) == []  # quiet: the answer is kept now
    heard: list[tuple[str, Any]] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(("started", task_result.status))

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(("finished", task_result.status))

    framework.task_started.connect(on_started)
    framework.task_finished.connect(on_finished)
    try:
        run_and_finish(examples().add, 3, 4)
    finally:
        framework.task_started.disconnect(on_started)
        framework.task_finished.disconnect(on_finished)
    assert heard == [("started", Status.RUNNING), ("finished", framework.SUCCESSFUL)]
    assert run_and_finish(examples().add, 5, 6) == []  # quiet again
    assert len(heard) == 2


@pytest.mark.django_db(transaction=True)
def test_a_receiver_swapped_for_another_between_runs_is_seen(console: io.StringIO) -> None:
    """A disconnect and a connect between two runs leave as many receivers as before: the
    new one is called all the same."""
    shaped(console)
    first: list[Any] = []
    second: list[Any] = []

    def one(sender: Any, task_result: Any, **kwargs: Any) -> None:
        first.append(task_result.status)

    def other(sender: Any, task_result: Any, **kwargs: Any) -> None:
        second.append(task_result.status)

    framework.task_finished.connect(one)
    try:
        run_and_finish(examples().add, 1, 2)
        framework.task_finished.disconnect(one)
        framework.task_finished.connect(other)
        run_and_finish(examples().add, 3, 4)
    finally:
        framework.task_finished.disconnect(one)
        framework.task_finished.disconnect(other)
    assert first == [framework.SUCCESSFUL] and second == [framework.SUCCESSFUL]


@pytest.mark.django_db(transaction=True)
def test_a_weak_receiver_gone_is_seen_gone(console: io.StringIO) -> None:
    """A receiver connected weakly that is collected leaves the framework's own alone: the
    next run is quiet again, and while it lived it was called."""
    shaped(console)
    heard: list[Any] = []

    class Listener:
        def on_finished(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
            heard.append(task_result.status)

    listener = Listener()
    framework.task_finished.connect(listener.on_finished)  # weak: a bound method
    backend = framework.task_backends["default"]
    run_and_finish(examples().add, 1, 2)
    assert heard == [framework.SUCCESSFUL]
    assert not unheard(framework.task_finished, backend, SUCCESSFUL)
    del listener
    import gc

    gc.collect()
    assert unheard(framework.task_finished, backend, SUCCESSFUL)
    run_and_finish(examples().add, 3, 4)
    assert heard == [framework.SUCCESSFUL]


@pytest.mark.django_db(transaction=True)
def test_debug_turned_on_during_a_run_logs_its_task_finished(console: io.StringIO) -> None:
    """Whether task_finished would be heard is asked at the finish, not taken from the start:
    a run may be long and logging may change meanwhile (here DEBUG turned on, which lets the
    framework's INFO line through). Taken from the start, the success's line was lost."""
    shaped(console)
    examples().add.enqueue(1, 2)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    writes = runner.TaskRunner("w1").run(delivery, q)  # started while INFO is dropped
    writes.call.run(q.client)
    assert writes.then is not None
    with override_settings(DEBUG=True):
        writes.then()
    assert states(console.getvalue()) == [str(framework.SUCCESSFUL)]


@pytest.mark.django_db(transaction=True)
def test_debug_turned_on_between_two_runs_is_heard_at_the_next(console: io.StringIO) -> None:
    """The start's answer is asked again at each run, not kept from the last."""
    shaped(console)
    assert run_and_finish(examples().add, 1, 2) == []
    with override_settings(DEBUG=True):
        run_and_finish(examples().add, 3, 4)
    assert states(console.getvalue()) == [str(Status.RUNNING), str(framework.SUCCESSFUL)]


@pytest.mark.django_db(transaction=True)
def test_a_handler_added_during_a_run_gets_its_task_finished(console: io.StringIO) -> None:
    """Logging changed between a quiet start and the end (a handler of the user's added):
    the end's line is logged, of the whole record (a quiet run built none till then)."""
    log = shaped(console)
    examples().add.enqueue(2, 3)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    writes = runner.TaskRunner("w1").run(delivery, q)  # started while INFO is dropped
    writes.call.run(q.client)
    assert writes.then is not None
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        writes.then()
    finally:
        log.removeHandler(handler)
    assert [r.getMessage().rsplit("=", 1)[-1] for r in lines] == [str(framework.SUCCESSFUL)]
    assert console.getvalue() == ""  # the console's line still dropped (DEBUG off)


@pytest.mark.django_db(transaction=True)
def test_a_receiver_connected_during_a_quiet_run_gets_the_whole_result(
    console: io.StringIO,
) -> None:
    """A run that started quiet has no record built; a receiver connected before its end
    gets a TaskResult of the record as the run left it: SUCCESSFUL, its start, end, worker,
    return value and arguments, as get_result reads them."""
    shaped(console)
    result = examples().add.enqueue(2, 5)
    q = get_queue(QUEUE)
    (delivery,) = q.claim(1)
    writes = runner.TaskRunner("w1").run(delivery, q)
    writes.call.run(q.client)
    heard: list[Any] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(task_result)

    framework.task_finished.connect(on_finished)
    try:
        assert writes.then is not None
        writes.then(1)
    finally:
        framework.task_finished.disconnect(on_finished)
    (sent,) = heard
    stored = examples().add.get_result(result.id)
    assert sent.status == framework.SUCCESSFUL and sent.return_value == 7
    assert (sent.args, sent.kwargs, sent.worker_ids) == ([2, 5], {}, ["w1"])
    assert sent.id == result.id and sent.task.func is examples().add.func
    for field in ("started_at", "last_attempted_at", "finished_at", "enqueued_at", "errors"):
        assert getattr(sent, field) == getattr(stored, field), field
