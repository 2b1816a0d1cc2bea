"""Finding a task's record for ``get_result``, and correcting it from where its message is.

The record is looked for in each queue the backend may have sent the task to: the queues it
lists, or, for a backend that takes any queue (``"QUEUES": []``), every configured queue, then
those in the registry of task queues (``conf.task_registry``). A task committed while Redis
was down is not there yet: its outbox row says READY. That row is read through the ORM, which
refuses to run on an event loop's thread (``SynchronousOnlyOperation``), so from async code it
is read on a thread of its own: ``get_result`` answers ``TaskResultDoesNotExist`` from sync and
async code alike.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import TypeVar

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.conf.settings import queue_names
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import redis_errors
from django_delayqueue.tasks.payload import (
    FAILED,
    ORDER,
    READY,
    RUNNING,
    DeadLettered,
    TaskRecord,
    write_order,
)

T = TypeVar("T")


def find_record(result_id: str, queues: Iterable[str]) -> tuple[Queue, TaskRecord] | None:
    """The queue and record of ``result_id`` among ``queues`` (None: nowhere)."""
    if not isinstance(result_id, str) or not result_id:
        return None
    for name in queues:
        queue = get_queue(name, task=True).shard_for(result_id)  # a sharded queue's shard
        with redis_errors(f"reading task result {result_id!r}"):
            stored = queue.client.hgetall(queue.keys.task_result(result_id))
        if stored:
            return queue, TaskRecord.from_hash(stored)
    return None


def registered_queues() -> list[str]:
    """The queues only the registry knows (a backend taking any queue sent tasks there)."""
    from django_delayqueue.conf.task_registry import registered

    known = set(queue_names())
    try:
        return [name for name in registered() if name not in known]
    except DelayQueueError:  # Redis down: reading a record would fail the same way
        return []


def find_in_outbox(result_id: str, queues: Iterable[str] | None) -> TaskRecord | None:
    """A task committed while Redis was down waits in the outbox: READY, as it will be.

    ``queues``: the backend's (None: any queue). From async code, read on another thread.
    """
    names = None if queues is None else set(queues)
    return off_the_event_loop(lambda: _outbox_record(result_id, names))


def _outbox_record(result_id: str, names: set[str] | None) -> TaskRecord | None:
    from django.db import DatabaseError, transaction

    from django_delayqueue.models import OutboxMessage
    from django_delayqueue.outbox.relay import outbox_databases

    for alias in outbox_databases():
        try:
            # A savepoint: a failed read must not abort the caller's open transaction.
            with transaction.atomic(using=alias):
                rows = OutboxMessage.objects.using(alias).filter(
                    message_id=result_id, mode=OutboxMessage.TASK
                )
                row = (rows if names is None else rows.filter(queue__in=names)).first()
        except DatabaseError:  # no table there (not migrated): nothing waits in it
            continue
        if row is not None:
            return TaskRecord.from_hash({"enqueued": row.record, "status": READY})
    return None


def off_the_event_loop(read: Callable[[], T]) -> T:
    """``read()`` here, or on a thread of its own when this thread runs an event loop (async
    code calling ``get_result``): the ORM refuses to run on one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return read()

    def on_a_thread() -> T:
        from django.db import connections

        try:
            return read()
        finally:
            connections.close_all()  # this thread's, which ends now

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="delayqueue-result") as pool:
        return pool.submit(on_a_thread).result()


def reconcile(queue: Queue, message_id: str, record: TaskRecord) -> None:
    """Correct what the record cannot know from where its message is now.

    A dead task requeued (the admin's Requeue) is waiting again: READY, and so is a RUNNING one
    whose message waits again without its worker having written (reaped, or given back at a
    shutdown). An unfinished task whose message is a dead letter (buried by a reap, a claim,
    or a consumer stopping) or gone (cancelled, purged) will never run: FAILED, with why
    among its errors (the dead letter's reason), finished when its message died. A message in
    flight is RUNNING until the delivery running it writes its end (a requeued task's FAILED
    is its last run's).
    """
    if record.status not in (FAILED, READY, RUNNING):
        return
    k = queue.keys
    with redis_errors("reading a task's message"):
        pipe = queue.client.pipeline(transaction=False)
        pipe.hexists(k.messages, message_id)
        pipe.zscore(k.garbage, message_id)
        pipe.zscore(k.unack, message_id)
        pipe.hget(k.tokens, message_id)
        pipe.hget(k.task_result(message_id), ORDER)
        pipe.hget(k.reasons, message_id)
        # The record again, after where its message is: ``record`` was read a round trip
        # earlier, and a delivery that ended since wrote its end with (before) its ack, so a
        # message gone by now has its end here.
        pipe.hgetall(k.task_result(message_id))
        stored, dead_since, in_flight, token, order, reason, fresh = pipe.execute()
    if fresh:
        _take_fields(record, TaskRecord.from_hash(fresh))
        if record.status not in (FAILED, READY, RUNNING):
            return
    if in_flight is not None:
        # Claimed: its RUNNING write comes with its worker's round. Its end, once written (a
        # FAILED read inside task_finished, before the message is buried), is the record's.
        ended = int(order or -1) >= write_order(token, FAILED)  # by this delivery
        if not ended:
            record.status, record.finished_at = RUNNING, None
        return
    if stored and dead_since is None:
        record.status, record.finished_at = READY, None
        return
    if record.status == FAILED:  # its last run failed, and said why
        return
    record.status = FAILED
    if dead_since is not None:
        why = to_str(reason) if reason else "dead-lettered"
        record.finished_at = int(dead_since)
    else:
        why = "its message is gone (cancelled, or purged from the dead letters)"
    record.errors.append(dead_letter_error(why))


def _take_fields(record: TaskRecord, newer: TaskRecord) -> None:
    for each in fields(TaskRecord):
        setattr(record, each.name, getattr(newer, each.name))


def dead_letter_error(reason: str) -> dict[str, str]:
    """A ``TaskError`` (as a record keeps it) for a task that ended without its run failing."""
    error = DeadLettered(reason)
    kind = type(error)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(traceback.format_exception_only(error)),
    }
