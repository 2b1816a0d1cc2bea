"""Running one task message in ``runqueue``: its result record, its signals, its outcome.

For each delivery of a task the record goes RUNNING (``started_at`` the first time,
``last_attempted_at`` and a worker id every time) and ``task_started`` is sent; the task is
imported and runs (``async def`` ones on an event loop of their own, ``takes_context`` ones
with a ``TaskContext``); then:

- it returned: SUCCESSFUL with its JSON return value, ``task_finished``, the message acked;
  a value that cannot be stored (not JSON, nested deeper than a reader could decode) fails it
  at once, as ``dq.Reject`` would: it ran, and must not run again;
- it raised, or could not be imported (a worker deployed before the code that enqueued it),
  and attempts are left: READY again with the error recorded, and the exception goes on to
  the consumer, which retries with the queue's backoff (``dq.Retry`` chooses its delay and
  records no error: a retry asked for is not a failure);
- it raised on its last attempt, or raised ``dq.Reject``: FAILED, ``task_finished``, and the
  message goes to the dead letters with its reason, as any message would.

The record is a hash of one field per fact (see django_delayqueue.tasks.payload), so a write
sets what changed without reading it first, and a task's run costs no round trip of its own:

- the RUNNING write goes with the consumer's next round trip (``write_soon``) if the task
  still runs by then (its result says it all otherwise); till then ``get_result`` reads
  RUNNING from the message being in flight;
- a success is written with the message's ack, before it (``WritesWithAck``), in one
  write_records.lua call with the round's other results, and ``task_finished`` is sent once
  Redis has it, so a receiver that reads the result finds it SUCCESSFUL;
- a failure is written at once (each write carries the attempt's own fields too, so any one
  of them leaves a whole record). The end's writes leave out what enqueue wrote (the
  ``enqueued`` JSON, the task's arguments): a record that lacks it (deleted by hand, or
  expired and its task requeued) is left alone by such a write, which then goes again whole
  (see django_delayqueue.tasks.attempt); a success's whole write with the consumer's next
  round trip, like RUNNING, sent again until it lands (its message is acked by then).

The record is read only when the task needs its history: a ``takes_context`` task, or a later
attempt (whose ``task_started`` result lists the errors so far). A first attempt's result is
what its message says; for a dead task requeued from the admin that means its
``task_started``/``task_finished`` results list the attempts since the requeue, while
``get_result`` lists them all. A finished record gets the backend's ``RESULT_TTL``; before
that it has none. If the worker dies before the ack, the task runs again (at-least-once) and
its record says so (two worker ids).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.db import close_old_connections

from django_delayqueue.conf.task_backends import backend_takes, delayqueue_backends
from django_delayqueue.core.consumer.limits.runs import handler_returned, stop_error
from django_delayqueue.core.consumer.outcomes import WhileRunning, WritesWithAck
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import (
    Aborted,
    Reject,
    Retry,
)
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.task_records import success_write
from django_delayqueue.observability.log_fields import message_fields
from django_delayqueue.tasks import framework
from django_delayqueue.tasks.attempt import Attempt, flat_arguments, mark_running, task_error
from django_delayqueue.tasks.payload import (
    FAILED,
    READY,
    SUCCESSFUL,
    TASK_KEY,
    WORKER_PREFIX,
    TaskRecord,
    write_order,
)
from django_delayqueue.tasks.results import (
    finished_result,
    load_task,
    stand_in_task,
    task_as_enqueued,
    to_task_result,
)
from django_delayqueue.tasks.return_values import _cause, _stored
from django_delayqueue.tasks.unheard import quiet as unheard_quiet
from django_delayqueue.tasks.unheard import unheard

logger = logging.getLogger(__name__)

# Sends a script call with the consumer's next round trip (Consumer.write_soon).
WriteSoon = Callable[[Queue, ScriptCall | WhileRunning], None]


class TaskRunner:
    """Runs the task messages of a worker's queues; ``worker_id`` goes into each result.

    ``write_soon`` (the consumer's) carries the RUNNING write; without one it is sent at once.
    """

    def __init__(self, worker_id: str, write_soon: WriteSoon | None = None) -> None:
        self.worker_id = worker_id
        self.write_soon = write_soon

    def run(self, message: Message, queue: Queue, *, atomic: str | None = None) -> Any:
        """Run the task in ``message``; raise what the consumer must see (retry or reject).

        Returns the writes of a success, for the consumer to send with the ack. ``atomic``:
        the database of an atomic queue, whose transaction the task runs in with its inbox
        row (django_delayqueue.inbox); a delivery found already done is not run again, and
        its record says SUCCESSFUL (its return value is not known here: None).
        """
        run = _TaskRun(self, message, queue)
        try:
            run.start()
            if atomic is None:
                value = _ended(_call(run.callee(), run.args, run.kwargs))
            else:
                from django_delayqueue.inbox import is_skipped, run_atomically

                value = run_atomically(
                    atomic, message, lambda: _ended(_call(run.callee(), run.args, run.kwargs))
                )
                if is_skipped(value):
                    handler_returned()
                    return dataclasses.replace(run.succeeded(None), already_done=True)
        except BaseException as e:  # the consumer decides what it means; the record follows
            handler_returned()
            # Aborted: the dead letters (the consumer records it so), never a retry.
            abort = _abort(stop_error())
            run.failed(_as_recorded(e, abort), dead=abort is not None or isinstance(e, Aborted))
            raise
        return run.succeeded(value)

    async def arun(self, message: Message, queue: Queue) -> Any:
        """:meth:`run` for an ``async def`` task, on the consumer's event loop: the task is
        awaited there; its record's reads and writes and the ``task_started`` receivers run in
        a thread (``sync_to_async``: they may use the database), each awaited to its end."""
        from django_delayqueue.dispatch import in_thread_to_its_end

        run = _TaskRun(self, message, queue)
        try:
            await in_thread_to_its_end(run.start, True)
            value = run.loaded.func(*run.args, **run.kwargs)  # the as-enqueued copy's too
            if inspect.isawaitable(value):
                value = await value
            stopped = stop_error()  # aborted, and it returned (stopped cooperatively)
            if stopped is not None:
                raise stopped
        except GeneratorExit:  # closed with its loop: nothing may be awaited any more
            raise
        except BaseException as e:  # a cancellation (time limit, abort) too
            from django_delayqueue.core.consumer.handlers.coroutines import requested_stop

            stop = requested_stop()  # an abort sends it to the dead letters: FAILED now
            abort = _abort(stop_error())
            if abort is None and stop is not None and stop[0] == "dead":
                abort = Aborted(stop[1])  # its canceller's reason: "aborted: ..."
            dead = abort is not None or isinstance(e, Aborted)
            await in_thread_to_its_end(run.failed, _as_recorded(e, abort), True, dead)
            raise
        return await in_thread_to_its_end(run.succeeded, value, True)

    def retry_buried(self, message: Message, queue: Queue, reason: str) -> None:
        """``task_finished`` for a delivery whose failure :meth:`run` recorded as a retry (READY,
        no signal: it would run again) and that its nack buried as aborted (an abort came
        before it): FAILED, its errors ending with ``Aborted`` and ``reason`` (the dead
        letter's), as its record now says (the consumer wrote it). On the consumer's thread,
        once that write landed: a receiver reading the result finds it FAILED. Never raises."""
        try:
            record = TaskRecord.from_payload(
                message.payload, queue.logical_name, message.due_ms, message.scheduled_ms
            )
            try:
                backend = framework.backend_named(record.backend)
            except Exception:  # an alias gone from TASKS: told by its queue's backend
                backend = _backend_of_queue(queue.logical_name)
            if backend is None or unheard(framework.task_finished, backend, FAILED):
                return
            # Its history (every attempt's error, worker and times), as get_result reads it.
            record = Attempt(self.worker_id, message, queue, record).read(record)
            if record.status != FAILED:  # the write was refused, or the read failed
                record.status, record.finished_at = FAILED, queue.clock.now_ms()
                record.errors.append(task_error(Aborted(reason)))
            try:
                task = task_as_enqueued(load_task(record.task), record)
            except ImportError:  # a worker deployed before the code that enqueued it
                task = stand_in_task(record)
            _send_robust(framework.task_finished, backend, to_task_result(record, message.id, task))
        except Exception:  # the signal is secondary: the task's end stands
            logger.exception(
                "queue %s: task %s: task_finished not sent",
                queue.name,
                message.id,
                extra=message_fields(message, queue.name),
            )
        finally:
            close_old_connections()  # its receivers' connections closed after them

    @staticmethod
    def load_scripts(queue: Queue) -> None:
        """Load the scripts a task's run sends, ahead of the first (a NOSCRIPT costs a trip)."""
        queue.load_record_script()

    def _send_soon(self, queue: Queue, call: ScriptCall | WhileRunning) -> None:
        if self.write_soon is None:
            (call.call() if isinstance(call, WhileRunning) else call).run(queue.client)
        else:
            self.write_soon(queue, call)

    @staticmethod
    def _failed(
        attempt: Attempt, record: TaskRecord, error: BaseException, backend: Any, task: Any
    ) -> None:
        """FAILED, written now; then ``task_finished`` (when the backend is known; for a task
        that could not be imported, with a stand-in Task of its module path)."""
        record.status, record.finished_at = FAILED, attempt.queue.clock.now_ms()
        record.errors.append(task_error(error))
        attempt.write_now(FAILED, error=error, ttl=_ttl(backend), finished_at=record.finished_at)
        if backend is not None and not unheard(framework.task_finished, backend, FAILED):
            task = stand_in_task(record) if task is None else task
            result = to_task_result(record, attempt.message.id, task)
            _send_robust(framework.task_finished, backend, result)


def _abort(stopped: BaseException | None) -> Aborted | None:
    """``stopped`` (:func:`stop_error`) if it is an abort's."""
    return stopped if isinstance(stopped, Aborted) else None


def _as_recorded(e: BaseException, abort: Aborted | None) -> BaseException:
    """What a task's record says ended it: ``abort`` once its message was aborted (an abort
    wins over a time limit that came in its grace, or an error the task raised after it, as it
    does in the journal and the dead letters), with ``e`` as its cause, so the traceback still
    shows where and how the task ended; else ``e``."""
    if abort is None or isinstance(e, Aborted):
        return e
    abort.__cause__ = e
    return abort


class _TaskRun(WhileRunning):
    """One run of a task message: before the call, and what its end writes. Handed to the
    consumer as its own RUNNING write (``WhileRunning``: see :meth:`call`).

    Most runs are a first attempt of a task with plain arguments that returns, whose signals
    nobody hears: such a run needs neither its record nor an :class:`Attempt`, only a few of
    their fields (its start, key and order); so both are built on first use (``record``,
    ``attempt``): by a run that fails, reads its history, builds a TaskResult, or finds its
    record gone. A task whose arguments hold a list or a dict builds them at once: it could
    change them in place as it runs, and its record keeps what enqueue wrote."""

    # One per task, kept until its round's reply (its success's ``then``): its fields in
    # slots, so its __dict__ (WhileRunning's) is never made.
    __slots__ = (
        "_attempt",
        "_marked",
        "_record",
        "_task",
        "alias",
        "args",
        "backend",
        "end",
        "ended",
        "kwargs",
        "loaded",
        "message",
        "path",
        "queue",
        "runner",
        "started",
        "started_at",
        "taken",
    )

    def __init__(self, runner: TaskRunner, message: Message, queue: Queue) -> None:
        self.runner, self.message, self.queue = runner, message, queue
        self.ended, self.taken = False, None
        self.started_at = int(queue.clock.now_ms())
        self._attempt: Attempt | None = None
        self._record: TaskRecord | None = None
        self._marked = False  # start() marked it RUNNING: so is the record, once built
        self.backend: Any = None
        # The Task imported (None: not yet, or it could not be); its copy with the record's
        # options (see task), built only for what reads them.
        self.loaded: Any = None
        self._task: Any = None
        # A success's end: its return value's JSON, the record's expiry, when it finished,
        # and the value a reader gets back (None till then).
        self.end: tuple[str, int, int, Any] | None = None
        # The TaskResult task_started was sent with; None when nothing would have read it.
        self.started: Any = None
        payload = message.payload
        args: Any = None
        kwargs: Any = None
        if type(payload) is dict:
            args, kwargs = payload.get("args") or [], payload.get("kwargs") or {}
        if type(args) is list and type(kwargs) is dict and flat_arguments(args, kwargs):
            # What from_payload reads of the payload, read the same way (its KeyError too).
            self.path: str = payload[TASK_KEY]
            self.alias: str = str(payload.get("backend") or "default")
            # The call's arguments: the payload's own, plain values (the call unpacks them
            # into a tuple and a dict of its own: nothing of theirs changes).
            self.args: list[Any] = args
            self.kwargs: dict[str, Any] = kwargs
        else:  # built now (and from_payload raises now for a payload it cannot take)
            record = self.record
            self._attempt = self._new_attempt(record)  # its enqueued encoded before the run
            self.path, self.alias = record.task, record.backend
            self.args, self.kwargs = record.args, record.kwargs

    @property
    def record(self) -> TaskRecord:
        """The record as this run leaves it so far (its message's, or the one read from
        Redis): RUNNING once started, SUCCESSFUL once it returned. Built on first use."""
        record = self._record
        if record is None:
            record = self._record = self._from_message()
            if self._marked:
                mark_running(record, self.started_at, self.runner.worker_id)
            if self.end is not None:
                _succeeded_record(record, self.end)
        return record

    def _from_message(self) -> TaskRecord:
        message = self.message
        return TaskRecord.from_payload(
            message.payload, self.queue.logical_name, message.due_ms, message.scheduled_ms
        )

    @property
    def attempt(self) -> Attempt:
        """This delivery's writes to its record (django_delayqueue.tasks.attempt), built on
        first use on the handler's thread (the consumer's thread builds one of its own)."""
        attempt = self._attempt
        if attempt is None:
            attempt = self._attempt = self._new_attempt(self._from_message())
        return attempt

    def _new_attempt(self, from_message: TaskRecord) -> Attempt:
        """An attempt whose enqueued field is ``from_message``'s (the message's record)."""
        return Attempt(
            self.runner.worker_id, self.message, self.queue, from_message, self.started_at
        )

    def call(self) -> ScriptCall:
        """The write of RUNNING (``WhileRunning``): built only if it is sent, by the consumer's
        next round while the task still runs, on its thread (most tasks end first: never).
        From what was set before the run was handed over, never changed after: its attempt,
        if it has one by then (always, with arguments the task could change), or one built
        here of the message's record, not kept (the handler's thread may build its own)."""
        attempt = self._attempt
        if attempt is None:
            attempt = self._new_attempt(self._from_message())
        return attempt.call()

    def _read(self) -> None:
        """The record read from Redis, for the history it holds (see Attempt.read)."""
        from_message = self.record
        if self._attempt is None:
            self._attempt = self._new_attempt(from_message)
        self._record = self._attempt.read(from_message)

    def start(self, close_connections: bool = False) -> None:
        """Everything before the call: the record RUNNING, ``task_started``, the arguments."""
        if close_connections:
            close_old_connections()
        message, queue = self.message, self.queue
        # First: a task that cannot be imported still ends as its backend says (its
        # RESULT_TTL, task_finished, the errors of its earlier attempts).
        try:
            self.backend = framework.backend_named(self.alias)
        except Exception:  # an alias gone from TASKS: fails as an import failure does,
            self.backend = _backend_of_queue(queue.logical_name)  # told by its queue's backend
            raise
        if message.attempt > 1:
            self._read()
        record = self._record
        loaded = load_task(self.path if record is None else record.task)
        if loaded.takes_context and message.attempt == 1:
            self._read()
        self._marked = True
        record = self._record
        if record is not None:
            mark_running(record, self.started_at, self.runner.worker_id)
            # The record's own: the call unpacks them into a tuple and a dict of its own.
            self.args, self.kwargs = record.args, record.kwargs
        self.runner._send_soon(queue, self)  # RUNNING, if it still runs at the next round
        self.loaded = loaded
        # Its TaskResult built only for what reads it (see django_delayqueue.tasks.unheard).
        quiet = unheard_quiet(framework.task_started, self.backend)
        if loaded.takes_context or not quiet:
            self.started = to_task_result(self.record, message.id, self.task)
        if not quiet:
            _send_robust(framework.task_started, self.backend, self.started)
        if loaded.takes_context:
            self.args = [framework.TaskContext(task_result=self.started), *self.args]

    @property
    def task(self) -> Any:
        """The Task with the record's priority, queue, backend and run_after (None before
        it is imported): what a TaskResult names, and a ``call`` of its own is given.

        Built on first use, not for every run: a quiet task's run (no TaskResult built, the
        framework's own ``call``) never reads it, and a delay queue's tasks each have a
        ``run_after`` of their own, so the copy kept by ``task_as_enqueued`` rarely serves
        the next one (a new copy and datetime, about 5 us a task)."""
        if self._task is None and self.loaded is not None:
            self._task = task_as_enqueued(self.loaded, self.record)
        return self._task

    def callee(self) -> Any:
        """What ``_call`` calls: the Task imported where the framework's own ``call`` would
        only call its function (the copy's is the same); else the copy, whose options a
        ``call`` of its own may read."""
        loaded = self.loaded
        return loaded if type(loaded).call is framework.Task.call else self.task

    def failed(self, e: BaseException, close_connections: bool = False, dead: bool = False) -> None:
        """The record after the run (or its start) raised ``e`` (``dead``: its message goes to
        the dead letters whatever its attempts)."""
        message, queue = self.message, self.queue
        self.ended = True  # its RUNNING, if not sent yet, never is: this write says more
        last = dead or isinstance(e, Reject) or message.attempt >= queue.settings.max_attempts
        try:
            attempt = self.attempt
            if last:  # what nack.lua will do too: no attempts left, or dead on purpose
                self.runner._failed(attempt, self.record, e, self.backend, self.task)
            else:  # a retry asked for is not an error
                error = None if isinstance(e, Retry) else e
                attempt.write_now(READY, error=error)
        except Exception:  # the record is secondary: the task's own outcome stands
            logger.exception(
                "queue %s: task %s: result not recorded",
                queue.name,
                message.id,
                extra=message_fields(message, queue.name),
            )
        finally:
            if close_connections:
                close_old_connections()

    def succeeded(self, value: Any, close_connections: bool = False) -> WritesWithAck:
        """The writes of a run that returned ``value``, for the consumer to send with the ack."""
        try:
            return self._succeeded(value)
        finally:
            if close_connections:
                close_old_connections()

    def _succeeded(self, value: Any) -> WritesWithAck:
        self.ended = True  # its RUNNING, if not sent yet, never is: its result says it all
        message, queue, backend = self.message, self.queue, self.backend
        try:
            returned, return_value = _stored(value)
            finished_at = int(queue.clock.now_ms())
            ttl = _ttl(backend)
            # Sent with the round's other results as one call (consumer.rounds.merged_writes):
            # what Attempt.success_write makes, of the run's own fields.
            token = message.token
            write = success_write(
                queue.keys.task_result(message.id),
                ttl,
                write_order(token, SUCCESSFUL),
                self.started_at,
                finished_at,
                f"{WORKER_PREFIX}{token}",
                self.runner.worker_id,
                returned,
            )
        except Exception as e:  # not JSON, nested too deep for a reader to decode, ...
            # It ran: running it again would repeat its effects for the same bad value. So
            # whatever keeps its result from being stored fails it once, with the error
            # recorded; and the Reject stands even when that cannot be written (a retry would
            # run it again).
            error = _cause(e)
            try:
                self.runner._failed(self.attempt, self.record, error, backend, self.task)
            except Exception:
                logger.exception(
                    "queue %s: task %s: result not recorded",
                    queue.name,
                    message.id,
                    extra=message_fields(message, queue.name),
                )
            raise Reject(f"task ran, but its result cannot be stored: {e}") from e
        end = self.end = (returned, ttl, finished_at, return_value)
        if self._record is not None:  # else built so when read (record)
            _succeeded_record(self._record, end)
        return WritesWithAck(write, self._finished, supersedes=self.taken)

    def _finished(self, reply: Any = None) -> None:
        """On the consumer's thread, once Redis has the success's write (its ``reply``)."""
        queue, backend, end = self.queue, self.backend, self.end
        if reply == -1 and end is not None:  # no "enqueued" (gone): nothing written, so whole
            # With the consumer's next round trip, sent again until it lands (an outage,
            # Redis full), as the RUNNING write: never a round trip of its own here, after
            # the ack, whose failure would lose the result.
            try:
                returned, ttl, finished_at, _ = end
                whole = self.attempt.write(
                    SUCCESSFUL, returned=returned, ttl=ttl, finished_at=finished_at, whole=True
                )
                self.runner._send_soon(queue, whole)
            except Exception:
                message = self.message
                logger.exception(
                    "queue %s: task %s: result not recorded",
                    queue.name,
                    message.id,
                    extra=message_fields(message, queue.name),
                )
        # Asked again, not taken from the start: the run may be long, and logging may have
        # changed meanwhile (DEBUG on, a handler added, a test's assertLogs).
        if unheard_quiet(framework.task_finished, backend):
            return  # nothing ran here that could have opened or used a connection
        if self.started is None:  # the started TaskResult's copy, or one built whole
            result = to_task_result(self.record, self.message.id, self.task)
        else:
            result = finished_result(self.started, self.record)
        try:
            _send_robust(framework.task_finished, backend, result)
        finally:
            close_old_connections()  # its receivers' connections closed after them


def _succeeded_record(record: TaskRecord, end: tuple[str, int, int, Any]) -> None:
    """``record`` as a run that ended with ``end`` (``_TaskRun.end``) leaves it."""
    record.status, record.finished_at, record.return_value = SUCCESSFUL, end[2], end[3]


def _ended(value: Any) -> Any:
    """``value``, the task having returned it; raised instead: the abort or the time limit
    that stopped it (its end whatever it returned)."""
    handler_returned()  # the task is done: no limit lands in writing its result
    stopped = stop_error()
    if stopped is not None:
        raise stopped
    return value


def _call(task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``task.call(*args, **kwargs)``: its function called directly where that is all the
    framework's ``Task.call`` would do (a plain function; ``async def`` ones it runs through
    ``async_to_sync``), without asking again for every run whether it is a coroutine one."""
    func = task.func
    if type(task).call is framework.Task.call:
        is_async = _async_funcs.get(func)
        if is_async is None:
            if len(_async_funcs) >= _ASYNC_FUNCS_KEPT:
                _async_funcs.clear()
            is_async = _async_funcs[func] = iscoroutinefunction(func)
        if not is_async:
            return func(*args, **kwargs)
    return task.call(*args, **kwargs)


# Per task function (kept with it, so never mistaken for another): whether it is async.
_ASYNC_FUNCS_KEPT = 256
_async_funcs: dict[Any, bool] = {}


def _backend_of_queue(name: str) -> Any:
    """A backend of this app that takes queue ``name`` (None: none does)."""
    for alias in delayqueue_backends():
        if backend_takes(alias, name):
            try:
                return framework.backend_named(alias)
            except Exception:  # cannot be loaded: the next one, or none
                continue
    return None


def _ttl(backend: Any) -> int:
    return int(getattr(backend, "result_ttl", None) or _default_ttl())


def _send_robust(signal: Any, backend: Any, result: Any) -> None:
    """Send a task signal; a receiver that raises is logged, and changes nothing of the task."""
    for receiver, response in signal.send_robust(type(backend), task_result=result):
        if isinstance(response, BaseException):
            logger.error(
                "task %s: receiver %s of a task signal raised",
                result.id,
                getattr(receiver, "__qualname__", receiver),
                exc_info=response,
            )


def _default_ttl() -> int:
    from django_delayqueue.tasks.backend import DEFAULT_RESULT_TTL

    return DEFAULT_RESULT_TTL
