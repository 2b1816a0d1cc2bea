"""One delayed-message queue on Redis: every state change is one Lua script.

:class:`Queue` owns one part per side of it, each a class in its own module, built in its
constructor around one shared :class:`~.queue_place.QueuePlace` (the queue's client, names,
keys, clock, replicas, shard count and current settings): ``scheduling.py`` (the producer: one
message), ``bulk.py`` (many messages), ``delivery.py`` (the consumer's transitions),
``inspection.py`` (counts, peek, stats), ``housekeeping.py`` (cancel, run now, requeue, purge)
and ``task_records.py`` (a task's result record). Each public method of the queue hands its call
to the part that owns it, by name: the parts never reach into the queue or each other but for
what they were given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django_delayqueue.core.bulk import (
    DEFAULT_CHUNK as DEFAULT_CHUNK,  # re-exported: the Spark job reads it here
)
from django_delayqueue.core.bulk import BulkScheduling
from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock, RedisClock
from django_delayqueue.core.delivery import MAX_CLAIM as MAX_CLAIM  # re-exported
from django_delayqueue.core.delivery import Delivery
from django_delayqueue.core.due_times import MAX_DUE_MS as MAX_DUE_MS  # re-exported
from django_delayqueue.core.due_times import Delay
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, Message
from django_delayqueue.core.housekeeping import Housekeeping
from django_delayqueue.core.inspection import Inspection
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.progress import Progress
from django_delayqueue.core.queue_place import ANNOUNCE_WITHIN_MS as ANNOUNCE_WITHIN_MS
from django_delayqueue.core.queue_place import QueuePlace
from django_delayqueue.core.replication import ReplicaAck
from django_delayqueue.core.results import (
    AbortResult,
    BulkResult,
    Page,
    Prepared,
    PromoteResult,
    ReapResult,
    ScheduleResult,
    Snapshot,
)
from django_delayqueue.core.scheduling import SEND_TOKEN_MEMORY_MS as SEND_TOKEN_MEMORY_MS
from django_delayqueue.core.scheduling import Scheduling
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.core.task_records import TaskRecords
from django_delayqueue.core.uniqueness import UniqueFor

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _told_by(owner: Callable[..., Any]) -> Callable[[_Method], _Method]:
    """Give a method of Queue the docstring of the part's method it hands its call to (set once,
    when the class is made: the call itself is a plain method call)."""

    def tell(method: _Method) -> _Method:
        method.__doc__ = owner.__doc__
        return method

    return tell


class Queue:
    """A named queue. Thread-safe as far as the redis-py client is (a pool per client)."""

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        prefix: str = "dq",
        settings: QueueSettings | None = None,
        clock: Clock | None = None,
        journal_maxlen: int = 100_000,
        replicas: ReplicaAck | None = None,
        shard: int | None = None,
        shards: int = 1,
    ) -> None:
        self.place = place = QueuePlace(
            client,
            name if shard is None else f"{name}#{shard}",
            name,
            QueueKeys(prefix, name, shard),
            clock or RedisClock(client),
            settings or QueueSettings(),
            replicas=replicas,
            shard_count=1 if shard is None else shards,
        )
        # What never changes once the queue is made, as plain attributes (the consumer reads
        # them in every round); what does (settings, client, shard_count) is the place's alone.
        self.name = place.name
        self.logical_name = place.logical_name
        self.keys = place.keys
        self.clock = place.clock
        self.replicas = place.replicas
        self.announce_args = place.announce_args
        self.scheduling = Scheduling(place)
        self.bulk = BulkScheduling(place, self.scheduling)
        self.delivery = Delivery(place)
        self.inspection = Inspection(place)
        self.housekeeping = Housekeeping(place, journal_maxlen)
        self.records = TaskRecords(place)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} {self.keys.tag}>"

    # Replaced at run time (the admin's overrides, conf/queues.py; a mirror, ShardedQueue):
    # kept on the place, so that every part reads the current one.
    @property
    def settings(self) -> QueueSettings:
        return self.place.settings

    @settings.setter
    def settings(self, value: QueueSettings) -> None:
        self.place.settings = value

    @property
    def client(self) -> RedisClient:
        return self.place.client

    @client.setter
    def client(self, value: RedisClient) -> None:
        self.place.client = value

    @property
    def shard_count(self) -> int:
        """How many shards the queue has (1: not sharded): each keeps a share of its limits."""
        return self.place.shard_count

    @shard_count.setter
    def shard_count(self, value: int) -> None:
        self.place.shard_count = value

    @property
    def journal_maxlen(self) -> int:
        """The cap of the journal stream cancels write to."""
        return self.housekeeping.journal_maxlen

    # A queue is its own only shard: callers that route by id (core.sharding) need not care.
    @property
    def shards(self) -> list[Queue]:
        return [self]

    def shard_for(self, message_id: str) -> Queue:
        """The queue that holds (or would hold) ``message_id``: this one."""
        return self

    def keys_for(self, message_id: str) -> QueueKeys:
        """The keys of the queue holding ``message_id`` (its task record, say)."""
        return self.keys

    @_told_by(QueuePlace.confirm_replicas)
    def confirm_replicas(self, what: str, result: Any = None) -> None:
        self.place.confirm_replicas(what, result)

    # --- the producer: scheduling.py, bulk.py -----------------------------------------------

    @_told_by(Scheduling.prepare)
    def prepare(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        now_ms: int | None = None,
        task: bool = False,
        key: str | None = None,
    ) -> Prepared:
        return self.scheduling.prepare(
            payload, delay=delay, at=at, id=id, now_ms=now_ms, task=task, key=key
        )

    @_told_by(Scheduling.schedule)
    def schedule(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        replace: bool = False,
        unique_for: UniqueFor | None = None,
        key: str | None = None,
    ) -> ScheduleResult:
        return self.scheduling.schedule(
            payload, delay=delay, at=at, id=id, replace=replace, unique_for=unique_for, key=key
        )

    @_told_by(Scheduling.send_prepared)
    def send_prepared(
        self,
        prepared: Prepared,
        *,
        now_ms: int | None = None,
        replace: bool = False,
        unique_ms: int = 0,
    ) -> ScheduleResult:
        return self.scheduling.send_prepared(
            prepared, now_ms=now_ms, replace=replace, unique_ms=unique_ms
        )

    @_told_by(Scheduling.send_with_record)
    def send_with_record(
        self,
        prepared: Prepared,
        record_key: str,
        record: str,
        *,
        priority: int = 0,
        now_ms: int | None = None,
    ) -> ScheduleResult:
        return self.scheduling.send_with_record(
            prepared, record_key, record, priority=priority, now_ms=now_ms
        )

    @_told_by(Scheduling.send_once)
    def send_once(
        self,
        prepared: Prepared,
        token: str,
        *,
        replace: bool = False,
        record_key: str | None = None,
        record: str | None = None,
        priority: int = 0,
        now_ms: int | None = None,
        unique_ms: int = 0,
    ) -> ScheduleResult | None:
        return self.scheduling.send_once(
            prepared,
            token,
            replace=replace,
            record_key=record_key,
            record=record,
            priority=priority,
            now_ms=now_ms,
            unique_ms=unique_ms,
        )

    @_told_by(BulkScheduling.schedule_many)
    def schedule_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        replace: bool = False,
    ) -> BulkResult:
        return self.bulk.schedule_many(items, chunk_size=chunk_size, replace=replace)

    @_told_by(BulkScheduling.schedule_prepared)
    def schedule_prepared(
        self,
        prepared: Sequence[Prepared],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        replace: bool = False,
        unique_ms: Sequence[int] | None = None,
    ) -> BulkResult:
        return self.bulk.schedule_prepared(
            prepared, chunk_size=chunk_size, replace=replace, unique_ms=unique_ms
        )

    # --- the consumer: delivery.py, task_records.py -----------------------------------------

    # What reads a script's reply needs no queue: Queue.promote_result(raw) as before.
    promote_result = staticmethod(Delivery.promote_result)
    claim_hold = staticmethod(Delivery.claim_hold)
    reap_result = staticmethod(Delivery.reap_result)

    @_told_by(Delivery.promote_call)
    def promote_call(self, now_ms: int, limit: int | None = None) -> ScriptCall:
        return self.delivery.promote_call(now_ms, limit)

    @_told_by(Delivery.promote)
    def promote(self, now_ms: int | None = None, limit: int | None = None) -> PromoteResult:
        return self.delivery.promote(now_ms, limit)

    @_told_by(Delivery.claim_call)
    def claim_call(
        self,
        now_ms: int,
        count: int | None = None,
        *,
        receipt: str | None = None,
        claim_id: str = "",
        replay_only: bool = False,
        reads_format: int = ENVELOPE_FORMAT,
    ) -> ScriptCall:
        return self.delivery.claim_call(
            now_ms,
            count,
            receipt=receipt,
            claim_id=claim_id,
            replay_only=replay_only,
            reads_format=reads_format,
        )

    @_told_by(Delivery.claim)
    def claim(
        self,
        count: int | None = None,
        now_ms: int | None = None,
        *,
        reads_format: int = ENVELOPE_FORMAT,
    ) -> list[Message]:
        return self.delivery.claim(count, now_ms, reads_format=reads_format)

    @_told_by(Delivery.claimed)
    def claimed(
        self, raw: Sequence[Any], now_ms: int, reads_format: int = ENVELOPE_FORMAT
    ) -> list[Message]:
        return self.delivery.claimed(raw, now_ms, reads_format)

    @_told_by(Delivery.leave_for_newer)
    def leave_for_newer(
        self, messages: Sequence[tuple[Message, int]], reads_format: int = ENVELOPE_FORMAT
    ) -> list[int]:
        return self.delivery.leave_for_newer(messages, reads_format)

    @_told_by(Delivery.ack_call)
    def ack_call(self, messages: Iterable[Message]) -> ScriptCall:
        return self.delivery.ack_call(messages)

    @_told_by(Delivery.ack)
    def ack(self, *messages: Message) -> int:
        return self.delivery.ack(*messages)

    @_told_by(Delivery.nack_call)
    def nack_call(
        self,
        failures: Iterable[tuple[Message, float | None, str]],
        now_ms: int,
        bury: bool = False,
    ) -> ScriptCall:
        return self.delivery.nack_call(failures, now_ms, bury)

    @_told_by(Delivery.nack)
    def nack(self, message: Message, *, delay: float | None = None, reason: str = "") -> int:
        return self.delivery.nack(message, delay=delay, reason=reason)

    @_told_by(Delivery.nack_many)
    def nack_many(
        self, failures: Sequence[tuple[Message, float | None, str]], *, bury: bool = False
    ) -> list[int]:
        return self.delivery.nack_many(failures, bury=bury)

    @_told_by(Delivery.bury)
    def bury(self, message: Message, reason: str) -> bool:
        return self.delivery.bury(message, reason)

    @_told_by(Delivery.reap_call)
    def reap_call(self, now_ms: int, limit: int | None = None) -> ScriptCall:
        return self.delivery.reap_call(now_ms, limit)

    @_told_by(Delivery.reap)
    def reap(self, now_ms: int | None = None, limit: int | None = None) -> ReapResult:
        return self.delivery.reap(now_ms, limit)

    @_told_by(Delivery.release)
    def release(self, *messages: Message) -> int:
        return self.delivery.release(*messages)

    @_told_by(Delivery.extend)
    def extend(self, *messages: Message, seconds: float | None = None) -> int:
        return self.delivery.extend(*messages, seconds=seconds)

    @_told_by(Delivery.write_progress)
    def write_progress(self, reports: Iterable[tuple[str, str, float, str]]) -> int:
        return self.delivery.write_progress(reports)

    @_told_by(TaskRecords.record_write_call)
    def record_write_call(
        self,
        message_id: str,
        *,
        order: int,
        kept_seconds: int = 0,
        absent: Sequence[Any] = (),
        in_order: Sequence[Any] = (),
        deleted: Sequence[str] = (),
        always: Sequence[Any] = (),
        required: str | None = None,
        mergeable: bool = False,
        fields: str | None = None,
        key: str | None = None,
    ) -> ScriptCall:
        return self.records.record_write_call(
            message_id,
            order=order,
            kept_seconds=kept_seconds,
            absent=absent,
            in_order=in_order,
            deleted=deleted,
            always=always,
            required=required,
            mergeable=mergeable,
            fields=fields,
            key=key,
        )

    @_told_by(TaskRecords.load_record_script)
    def load_record_script(self) -> None:
        self.records.load_record_script()

    # --- reading: inspection.py -------------------------------------------------------------

    @_told_by(Inspection.counts_call)
    def counts_call(self, now_ms: int) -> ScriptCall:
        return self.inspection.counts_call(now_ms)

    @_told_by(Inspection.overdue_call)
    def overdue_call(self, now_ms: int) -> ScriptCall:
        return self.inspection.overdue_call(now_ms)

    @_told_by(Inspection.activity_call)
    def activity_call(
        self, alive_since_ms: int, most_entries: int, most_consumers: int
    ) -> ScriptCall:
        return self.inspection.activity_call(alive_since_ms, most_entries, most_consumers)

    @_told_by(Inspection.counts)
    def counts(self) -> dict[str, int]:
        return self.inspection.counts()

    @_told_by(Inspection.snapshot)
    def snapshot(self, now_ms: int | None = None) -> Snapshot:
        return self.inspection.snapshot(now_ms)

    @_told_by(Inspection.snapshot_result)
    def snapshot_result(self, raw: Sequence[Any], now_ms: int) -> Snapshot:
        return self.inspection.snapshot_result(raw, now_ms)

    @_told_by(Inspection.progress_of)
    def progress_of(self, *message_ids: str) -> dict[str, Progress]:
        return self.inspection.progress_of(*message_ids)

    @_told_by(Inspection.scheduled_times)
    def scheduled_times(self, message_ids: Sequence[str]) -> dict[str, int]:
        return self.inspection.scheduled_times(message_ids)

    @_told_by(Inspection.peek)
    def peek(self, state: str, offset: int = 0, limit: int = 50) -> Page:
        return self.inspection.peek(state, offset, limit)

    # --- staff's changes: housekeeping.py ---------------------------------------------------

    @_told_by(Housekeeping.cancel)
    def cancel(self, *ids: str) -> int:
        return self.housekeeping.cancel(*ids)

    @_told_by(Housekeeping.abort)
    def abort(self, message_id: str, reason: str = "") -> AbortResult:
        return self.housekeeping.abort(message_id, reason)

    @_told_by(Housekeeping.run_now)
    def run_now(self, *ids: str) -> int:
        return self.housekeeping.run_now(*ids)

    @_told_by(Housekeeping.requeue)
    def requeue(self, *ids: str, limit: int = 1000) -> int:
        return self.housekeeping.requeue(*ids, limit=limit)

    @_told_by(Housekeeping.purge)
    def purge(self, *ids: str, limit: int = 1000) -> int:
        return self.housekeeping.purge(*ids, limit=limit)
