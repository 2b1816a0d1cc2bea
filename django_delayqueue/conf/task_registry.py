"""The queues a Tasks backend with ``"QUEUES": []`` sent tasks to, kept in Redis.

Django documents an empty ``QUEUES`` as "any queue name is valid": a task may name a queue no
setting lists. Its message goes to that delay queue like any other, and its name goes into one
set, ``{<prefix>}:task-queues``, so that ``runqueue`` (without queue arguments) serves it, from
its start or from its next settings refresh, and ``get_result`` knows where to look.

A name is added before its first message is sent (a worker that finds the name finds the
message by its next round), and again every ``REGISTER_AGAIN_SECONDS`` by each process that
sends there, so a registry lost with a flushed Redis fills again. A name stays: a queue with
nothing waiting costs a worker one promote per round.
"""

from __future__ import annotations

import threading
import time

from django_delayqueue.conf.connection import get_client
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.conf.task_backends import any_task_queue, task_queue_names
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.keys import validate_name
from django_delayqueue.core.scripts.calls import redis_errors

REGISTER_AGAIN_SECONDS = 60.0

_lock = threading.Lock()
_registered_at: dict[tuple[str, str], float] = {}  # (prefix, queue) -> when this process did


def registry_key() -> str:
    """The set of queue names (outside every queue's hash tag, as the recurring definitions)."""
    return f"{{{dq_settings.PREFIX}}}:task-queues"


def register(name: str) -> None:
    """Add queue ``name`` to the registry (at most every REGISTER_AGAIN_SECONDS per process).

    Raises RedisUnavailable when Redis is down (the caller's send would fail as well).
    """
    memo = (str(dq_settings.PREFIX), name)
    now = time.monotonic()
    with _lock:
        if now - _registered_at.get(memo, -REGISTER_AGAIN_SECONDS) < REGISTER_AGAIN_SECONDS:
            return
    with redis_errors(f"registering task queue {name!r}"):
        get_client().sadd(registry_key(), name)
    with _lock:
        _registered_at[memo] = now


def register_unlisted(name: str) -> None:
    """Register a task queue ``name`` unless a backend lists it (runqueue knows those)."""
    if any_task_queue() and name not in task_queue_names():
        register(name)


def registered() -> list[str]:
    """The names in the registry that can be queue names, sorted (one round trip).

    Raises RedisUnavailable when Redis is down.
    """
    with redis_errors("reading the task queues"):
        members = get_client().smembers(registry_key())
    names = []
    for member in members:
        try:
            names.append(validate_name(to_str(member), "queue name"))
        except ConfigurationError:  # not written by this app
            continue
    return sorted(names)


def is_registered(name: str) -> bool:
    """Whether ``name`` is in the registry (one round trip). RedisUnavailable when down."""
    with redis_errors("reading the task queues"):
        return bool(get_client().sismember(registry_key(), name))


def forget() -> None:
    """Forget what this process registered (the settings changed: maybe the Redis too)."""
    with _lock:
        _registered_at.clear()
