"""The one place that builds a :class:`~django_delayqueue.core.queue.Queue` for Django.

A queue built here uses the settings' Redis client, clock, key prefix and journal cap, so
``dq.schedule``, the stats, the admin and ``runqueue`` all write the same keys the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from django_delayqueue.conf.connection import (
    get_client,
    get_clock,
    in_monitoring_reads,
    replica_ack,
)
from django_delayqueue.conf.settings import (
    dq_settings,
    file_queue_settings,
    queue_names,
    queue_shards,
    unknown_queue,
)
from django_delayqueue.conf.task_backends import any_task_queue
from django_delayqueue.core.keys import validate_name
from django_delayqueue.core.logical_queue import LogicalQueue
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.core.sharding import ShardedQueue
from django_delayqueue.mirror.queue_overrides import effective_settings

_queues: dict[str, LogicalQueue] = {}
_lock = threading.Lock()


def configured(names: Iterable[str] | None = None, *, tasks: bool = False) -> list[str]:
    """``names`` (default: every configured queue) without repeats, in the order given.

    Raises :class:`~django_delayqueue.core.errors.ConfigurationError` for a name that is not
    in ``DELAYQUEUE['QUEUES']`` (nor a TASKS backend's). With ``tasks``, any valid name when a
    TASKS backend of this app takes any queue (``"QUEUES": []``): a task queue of its own.
    """
    known = queue_names()
    chosen = known if names is None else list(dict.fromkeys(names))
    for name in chosen:
        if name in known:
            continue
        if not (tasks and any_task_queue()):
            raise unknown_queue(name)
        validate_name(name, "queue name")
    return chosen


def build_queue(name: str, settings: QueueSettings | None = None) -> LogicalQueue:
    """A new Queue object for configured queue ``name`` (default settings: the file's); a
    :class:`ShardedQueue` over its shards when it has ``shards`` > 1."""
    shards = shard_queues(name, settings)
    return shards[0] if len(shards) == 1 else ShardedQueue(shards)


def shard_queues(
    name: str, settings: QueueSettings | None = None, count: int | None = None
) -> list[Queue]:
    """The Queue objects a consumer of ``name`` claims from: the queue, or each of its shards
    (``count`` of them; default: its ``shards`` setting)."""
    count = queue_shards(name) if count is None else count
    return [
        Queue(
            get_client(),
            name,
            prefix=dq_settings.PREFIX,
            settings=file_queue_settings(name) if settings is None else settings,
            clock=get_clock(),
            journal_maxlen=int(dq_settings.JOURNAL_MAXLEN),
            replicas=replica_ack(),
            shard=None if count == 1 else index,
            shards=count,
        )
        for index in range(count)
    ]


def queue_settings(name: str) -> QueueSettings:
    """Effective settings of ``name``: the file merged with the published admin overrides.

    Read from Redis at most every ``SETTINGS_REFRESH_SECONDS`` per process; when Redis is down
    the last known (or the file's) settings are used.
    """
    return effective_settings(name)


def get_queue(name: str, *, task: bool = False) -> LogicalQueue:
    """The configured queue ``name`` (one object per name; its settings kept current).

    Raises :class:`~django_delayqueue.core.errors.ConfigurationError` for a queue that is not
    in ``DELAYQUEUE['QUEUES']``. ``task``: a task's queue (see :func:`configured`).

    Inside :func:`~django_delayqueue.conf.connection.monitoring_reads` (metrics/, health/),
    a new object each call, not cached: it holds the monitoring client and its short
    timeouts, which every later schedule, cancel or relay of the process would run on.
    """
    if in_monitoring_reads():
        configured([name], tasks=task)
        return build_queue(name, queue_settings(name))
    q = _queues.get(name)
    if q is None:
        configured([name], tasks=task)
        with _lock:
            q = _queues.get(name)
            if q is None:
                q = _queues[name] = build_queue(name, queue_settings(name))
                return q
    # Cheap: queue_settings reads Redis at most every SETTINGS_REFRESH_SECONDS.
    q.settings = queue_settings(name)
    return q


def reset() -> None:
    """Forget the cached queues (after the settings changed)."""
    with _lock:
        _queues.clear()
