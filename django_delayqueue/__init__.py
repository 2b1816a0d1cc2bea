"""django-delayqueue: a reliable delayed-message queue on Redis for Django.

    import django_delayqueue as dq
    dq.schedule("order-close", {"order_id": 42}, delay=1800)

Importing the package does not import Django: the Django-facing names (``schedule``,
``cancel``, ``get_queue``, ``topic``) load on first use, so the Django-free ``core`` stays
importable by a Spark executor or a plain script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import (
    Aborted,
    ConfigurationError,
    DelayQueueError,
    PayloadError,
    RedisOutOfMemory,
    RedisUnavailable,
    Reject,
    Retry,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
)

if TYPE_CHECKING:
    from django_delayqueue.api import abort, cancel, get_queue, schedule, topic
    from django_delayqueue.core.consumer.handlers.progress_reports import progress
    from django_delayqueue.core.consumer.limits.runs import abort_requested

_LAZY = {
    "abort": "api",
    "abort_requested": "core.consumer.limits.runs",
    "schedule": "api",
    "cancel": "api",
    "get_queue": "api",
    "topic": "api",
    "progress": "core.consumer.handlers.progress_reports",
}

__all__ = [
    "Aborted",
    "ConfigurationError",
    "DelayQueueError",
    "Message",
    "PayloadError",
    "RedisOutOfMemory",
    "RedisUnavailable",
    "Reject",
    "Retry",
    "SoftTimeLimitExceeded",
    "TimeLimitExceeded",
    "abort",
    "abort_requested",
    "cancel",
    "get_queue",
    "progress",
    "schedule",
    "topic",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
