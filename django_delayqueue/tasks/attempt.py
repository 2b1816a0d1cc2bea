"""One delivery of a task: the writes it makes to its result record (see
django_delayqueue.tasks.runner for when each is sent, and write_record.lua for how a write lands
whatever order writes arrive in)."""

from __future__ import annotations

import json
import logging
import traceback
from json.encoder import encode_basestring as _quoted
from typing import Any

from django_delayqueue.core.consumer.outcomes import WhileRunning
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import CorruptEnvelope, RedisUnavailable
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptCall, redis_errors
from django_delayqueue.core.task_records import success_write
from django_delayqueue.observability.log_fields import message_fields
from django_delayqueue.tasks.payload import (
    ENQUEUED,
    ERROR_PREFIX,
    FINISHED_AT,
    LAST_ATTEMPTED_AT,
    RETURN_VALUE,
    RUNNING,
    STARTED_AT,
    STATUS,
    WORKER_PREFIX,
    TaskRecord,
    write_order,
)

logger = logging.getLogger(__name__)


class Attempt(WhileRunning):
    """One delivery of a task: the fields it writes to its record; its RUNNING write, as a
    ``WhileRunning`` (see :meth:`call`). The runner builds one only for a run that needs it
    (a failure, a history read, a record gone, arguments a task could change in place), and
    hands the consumer its run instead, which builds one only to send RUNNING."""

    # Kept with its run until the round's reply: its fields in slots, so its __dict__
    # (WhileRunning's) is never made: one object fewer for the collector to walk.
    __slots__ = (
        "_enqueued",
        "_from_message",
        "_order",
        "ended",
        "key",
        "message",
        "queue",
        "started_at",
        "taken",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        message: Message,
        queue: Queue,
        from_message: TaskRecord,
        started_at: int | None = None,
    ) -> None:
        self.ended, self.taken = False, None
        self.worker_id, self.message, self.queue = worker_id, message, queue
        self.key = queue.keys.task_result(message.id)
        # Given: the run's, which took it before it built this attempt (only if it needed one).
        self.started_at = int(queue.clock.now_ms()) if started_at is None else started_at
        # The record's enqueued field, as the message tells it: needed only by a write that
        # finds the record gone (see write), so encoded only then; at once where the task
        # could change it in place as it runs (a list or dict among its arguments).
        self._from_message = from_message
        self._enqueued = None if flat(from_message) else from_message.enqueued_json()
        self._order = write_order(message.token, RUNNING)  # its end's: one more (write_order)

    @property
    def enqueued(self) -> str:
        if self._enqueued is None:
            self._enqueued = self._from_message.enqueued_json()
        return self._enqueued

    def read(self, from_message: TaskRecord) -> TaskRecord:
        """The record in Redis (one round trip), or the message's when it is gone or bad, or
        cannot be read: the read only gives the task its history (errors so far), and a Redis
        blip before the task starts must not use up one of its attempts (on the last one, fail
        it unstarted). Every write of the attempt sets its own fields whole, without it."""
        try:
            with redis_errors(f"reading task result {self.message.id}"):
                stored = self.queue.client.hgetall(self.key)
            return TaskRecord.from_hash(stored)
        except RedisUnavailable as e:
            logger.warning(
                "queue %s: task result %s not read (%s): run with what its message says",
                self.queue.name,
                self.message.id,
                e,
                extra=message_fields(self.message, self.queue.name),
            )
            return from_message
        except CorruptEnvelope as e:  # gone (deleted by hand) or unreadable: rebuilt
            logger.warning(
                "queue %s: task result %s %s: rebuilt",
                self.queue.name,
                self.message.id,
                e,
                extra=message_fields(self.message, self.queue.name),
            )
            return from_message

    def call(self) -> ScriptCall:
        """The write of RUNNING (``WhileRunning``): built only if it is sent, by the consumer's
        next round while the task still runs; a task that ends first never builds it (its
        result says it all: ``ended``), and most tasks do. Built on whichever thread sends it,
        from this attempt's own fields only (set before the task runs, never changed after)."""
        return self.write(RUNNING, whole=True)

    def write_now(
        self, status: str, *, error: BaseException | None = None, ttl: int = 0,
        finished_at: int | None = None,
    ) -> None:  # fmt: skip
        """:meth:`write` sent at once; whole again if the record turned out gone."""
        kwargs: dict[str, Any] = {"error": error, "ttl": ttl, "finished_at": finished_at}
        if self.write(status, **kwargs).run(self.queue.client) == -1:
            self.write(status, **kwargs, whole=True).run(self.queue.client)

    def write(
        self,
        status: str,
        *,
        error: BaseException | None = None,
        returned: str | None = None,
        ttl: int = 0,
        finished_at: int | None = None,
        whole: bool = False,
        mergeable: bool = False,
    ) -> ScriptCall:
        """The write of this attempt's fields with ``status``: whole in itself (the start, and
        with ``whole`` what enqueue wrote, where it is gone), whichever of the attempt's
        writes lands. Not ``whole``, it leaves a record without ``enqueued`` (deleted by hand,
        or expired and its task requeued) as it is, and its reply says so (-1): then the
        same write goes again whole. Most records have it: a task's end costs no encoding of
        its arguments again."""
        # Whichever lands last, the status is the latest one's (see write_order).
        order = self._order + (status != RUNNING)
        fields = self.fields(status, error, returned, finished_at, whole)
        return self.queue.record_write_call(
            self.message.id,
            order=order,
            kept_seconds=ttl,
            fields=fields,
            required=None if whole else ENQUEUED,
            mergeable=mergeable,
            key=self.key,
        )

    def success_write(self, returned: str, ttl: int, finished_at: int) -> ScriptCall:
        """The write every task that returns makes, sent with its ack: what ``write(SUCCESSFUL,
        returned=..., ttl=..., finished_at=..., mergeable=True)`` writes (test_tasks_record
        compares the records both leave), as write_records.lua's compact success text rather
        than JSON lists: cheaper to build here and for Redis to read (see
        :func:`~django_delayqueue.core.task_records.success_fields`)."""
        return success_write(
            self.key,
            int(ttl),
            self._order + 1,
            self.started_at,
            int(finished_at),
            f"{WORKER_PREFIX}{self.message.token}",
            self.worker_id,
            returned,
        )

    def fields(
        self,
        status: str,
        error: BaseException | None,
        returned: str | None,
        finished_at: int | None,
        whole: bool,
    ) -> str:
        """The write's field lists as write_record.lua takes them (the text ``record_fields``
        makes of the lists in the comments), written out: a worker builds one per task, and
        only the values that may need it are escaped (field names and statuses are plain
        names, times whole numbers)."""
        quoted = _quoted
        token, started_at = self.message.token, self.started_at
        # Set where absent: [STARTED_AT, started_at] (+ [ENQUEUED, what enqueue wrote]).
        absent = f'"{STARTED_AT}","{started_at}"'
        if whole:
            absent += f',"{ENQUEUED}",{quoted(self.enqueued)}'
        # In order: [STATUS, status, LAST_ATTEMPTED_AT, started_at] and the end of an attempt
        # (finished_at, return_value), which goes with its status: a late end of an older
        # attempt must not mark the latest one finished. Not given, they are deleted: a
        # requeued task running again has no end yet (nor the expiry of its last one).
        in_order = f'"{STATUS}",{quoted(status)},"{LAST_ATTEMPTED_AT}","{started_at}"'
        # Always, per delivery (its token in the name): set whatever the order, never clashing.
        always = f"{quoted(f'{WORKER_PREFIX}{token}')},{_quoted_worker(self.worker_id)}"
        if finished_at is not None and returned is not None and error is None:  # a success
            in_order += f',"{FINISHED_AT}","{int(finished_at)}","{RETURN_VALUE}",{quoted(returned)}'
            return f"[[{absent}],[{in_order}],[],[{always}]]"
        deleted = []
        if finished_at is None:
            deleted.append(f'"{FINISHED_AT}"')
        else:
            in_order += f',"{FINISHED_AT}","{int(finished_at)}"'
        if returned is None:
            deleted.append(f'"{RETURN_VALUE}"')
        else:
            in_order += f',"{RETURN_VALUE}",{quoted(returned)}'
        if error is not None:
            error_json = json.dumps(task_error(error))
            always += f",{quoted(f'{ERROR_PREFIX}{token}')},{quoted(error_json)}"
        return f"[[{absent}],[{in_order}],[{','.join(deleted)}],[{always}]]"


def mark_running(record: TaskRecord, started_at: int, worker_id: str) -> None:
    """``record`` as a delivery started at ``started_at`` on ``worker_id`` leaves it."""
    record.status = RUNNING
    record.started_at = record.started_at or started_at
    record.last_attempted_at = started_at
    record.worker_ids.append(worker_id)


def _quoted_worker(worker_id: str) -> str:
    """``worker_id`` as JSON text: a worker has one, written into every result."""
    quoted = _worker_quoted.get(worker_id)
    if quoted is None:
        if len(_worker_quoted) >= 64:
            _worker_quoted.clear()
        quoted = _worker_quoted[worker_id] = _quoted(worker_id)
    return quoted


_worker_quoted: dict[str, str] = {}

_SCALARS = frozenset({str, int, float, bool, type(None)})


def flat(record: TaskRecord) -> bool:
    """Whether a record's arguments are all scalars: nothing a task could change in place."""
    return flat_arguments(record.args, record.kwargs)


def flat_arguments(args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``args`` and ``kwargs``' values are all scalars: nothing a task could change in
    place."""
    # At C speed (a worker asks for every task it runs): the set of their types, each known.
    return _SCALARS.issuperset(map(type, args)) and (
        not kwargs or _SCALARS.issuperset(map(type, kwargs.values()))
    )


def task_error(error: BaseException) -> dict[str, str]:
    kind = type(error)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(traceback.format_exception(error)),
    }
