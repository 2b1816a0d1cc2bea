"""One delayed-message queue on Redis: every state change is one Lua script.

:class:`Queue` owns one part per side of it, each a class in its own module, built in its
constructor around one shared :class:`~.queue_place.QueuePlace` (the queue's client, names,
keys, clock, replicas, shard count and current settings): ``scheduling.py`` (the producer: one
message), ``bulk.py`` (many messages), ``delivery.py`` (the consumer's transitions),
``inspection.py`` (counts, peek, stats), ``housekeeping.py`` (cancel, run now, requeue, purge)
and ``task_records.py`` (a task's result record). Each public method of the queue is the method
of the part that owns it (:class:`_PartMethod`): the parts never reach into the queue or each
other but for what they were given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from django_delayqueue.core.bulk import (
    DEFAULT_CHUNK as DEFAULT_CHUNK,  # re-exported: the Spark job reads it here
)
from django_delayqueue.core.bulk import BulkScheduling
from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock, RedisClock
from django_delayqueue.core.delivery import MAX_CLAIM as MAX_CLAIM  # re-exported
from django_delayqueue.core.delivery import Delivery
from django_delayqueue.core.due_times import MAX_DUE_MS as MAX_DUE_MS  # re-exported
from django_delayqueue.core.housekeeping import Housekeeping
from django_delayqueue.core.inspection import Inspection
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.queue_place import ANNOUNCE_WITHIN_MS as ANNOUNCE_WITHIN_MS
from django_delayqueue.core.queue_place import QueuePlace
from django_delayqueue.core.replication import ReplicaAck
from django_delayqueue.core.scheduling import SEND_TOKEN_MEMORY_MS as SEND_TOKEN_MEMORY_MS
from django_delayqueue.core.scheduling import Scheduling
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.core.task_records import TaskRecords

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _PartMethod(Generic[_P, _R]):
    """A public method of :class:`Queue` that is one of its parts' (``method`` of the part the
    queue holds as ``part``): read on a queue, it is that part's bound method, so its signature
    and docstring are written once, on the part. Looked up at each read, never kept on the
    queue: a patch of ``Queue`` or of a part's class (a test's ``mock.patch.object``), or a
    part replaced, is seen by every queue at once, as with a plain method. Called on the class
    (``Queue.counts(q)``), it calls the queue's."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, _P], _R]) -> None:
        self.part = part
        self.method = method
        self.__doc__ = method.__doc__
        self.__name__ = method.__name__

    @overload
    def __get__(self, queue: None, owner: type) -> _PartMethod[_P, _R]: ...

    @overload
    def __get__(self, queue: object, owner: type) -> Callable[_P, _R]: ...

    def __get__(self, queue: object | None, owner: type) -> Any:
        if queue is None:
            return self  # read on the class (its docstring, a subclass's super())
        return getattr(getattr(queue, self.part), self.__name__)

    def __call__(self, queue: Any, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = getattr(getattr(queue, self.part), self.__name__)(*args, **kwargs)
        return result


class _OnPlace(Generic[_R]):
    """An attribute of :class:`Queue` that lives on its :class:`QueuePlace` under the same name
    (read and written there), so that the parts, which hold the place, see every change."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, queue: None, owner: type) -> _OnPlace[_R]: ...

    @overload
    def __get__(self, queue: object, owner: type) -> _R: ...

    def __get__(self, queue: Any, owner: type) -> Any:
        return self if queue is None else getattr(queue.place, self.name)

    def __set__(self, queue: Any, value: _R) -> None:
        setattr(queue.place, self.name, value)


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

    # Replaced at run time (the admin's overrides, conf/queues.py; a mirror, ShardedQueue; a
    # test's client): kept on the place, so that every part reads the current one.
    settings = _OnPlace[QueueSettings]()
    client = _OnPlace[RedisClient]()
    shard_count = _OnPlace[int]()  # how many shards the queue has (1: not sharded)

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

    confirm_replicas = _PartMethod("place", QueuePlace.confirm_replicas)

    # --- the producer: scheduling.py, bulk.py -----------------------------------------------

    prepare = _PartMethod("scheduling", Scheduling.prepare)
    schedule = _PartMethod("scheduling", Scheduling.schedule)
    send_prepared = _PartMethod("scheduling", Scheduling.send_prepared)
    send_with_record = _PartMethod("scheduling", Scheduling.send_with_record)
    send_once = _PartMethod("scheduling", Scheduling.send_once)
    schedule_many = _PartMethod("bulk", BulkScheduling.schedule_many)
    schedule_prepared = _PartMethod("bulk", BulkScheduling.schedule_prepared)

    # --- the consumer: delivery.py, task_records.py -----------------------------------------

    # What reads a script's reply needs no queue: Queue.promote_result(raw) as before.
    promote_result = staticmethod(Delivery.promote_result)
    claim_hold = staticmethod(Delivery.claim_hold)
    reap_result = staticmethod(Delivery.reap_result)

    promote_call = _PartMethod("delivery", Delivery.promote_call)
    promote = _PartMethod("delivery", Delivery.promote)
    claim_call = _PartMethod("delivery", Delivery.claim_call)
    claim = _PartMethod("delivery", Delivery.claim)
    claimed = _PartMethod("delivery", Delivery.claimed)
    leave_for_newer = _PartMethod("delivery", Delivery.leave_for_newer)
    ack_call = _PartMethod("delivery", Delivery.ack_call)
    ack = _PartMethod("delivery", Delivery.ack)
    nack_call = _PartMethod("delivery", Delivery.nack_call)
    nack = _PartMethod("delivery", Delivery.nack)
    nack_many = _PartMethod("delivery", Delivery.nack_many)
    bury = _PartMethod("delivery", Delivery.bury)
    reap_call = _PartMethod("delivery", Delivery.reap_call)
    reap = _PartMethod("delivery", Delivery.reap)
    release = _PartMethod("delivery", Delivery.release)
    extend = _PartMethod("delivery", Delivery.extend)
    write_progress = _PartMethod("delivery", Delivery.write_progress)
    record_write_call = _PartMethod("records", TaskRecords.record_write_call)
    load_record_script = _PartMethod("records", TaskRecords.load_record_script)

    # --- reading: inspection.py -------------------------------------------------------------

    counts_call = _PartMethod("inspection", Inspection.counts_call)
    overdue_call = _PartMethod("inspection", Inspection.overdue_call)
    activity_call = _PartMethod("inspection", Inspection.activity_call)
    counts = _PartMethod("inspection", Inspection.counts)
    snapshot = _PartMethod("inspection", Inspection.snapshot)
    snapshot_result = _PartMethod("inspection", Inspection.snapshot_result)
    progress_of = _PartMethod("inspection", Inspection.progress_of)
    scheduled_times = _PartMethod("inspection", Inspection.scheduled_times)
    peek = _PartMethod("inspection", Inspection.peek)

    # --- staff's changes: housekeeping.py ---------------------------------------------------

    cancel = _PartMethod("housekeeping", Housekeeping.cancel)
    abort = _PartMethod("housekeeping", Housekeeping.abort)
    run_now = _PartMethod("housekeeping", Housekeeping.run_now)
    requeue = _PartMethod("housekeeping", Housekeeping.requeue)
    purge = _PartMethod("housekeeping", Housekeeping.purge)
