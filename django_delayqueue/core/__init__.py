"""The Django-free engine: importable by a Spark executor or a plain script."""

from django_delayqueue.core.clock import Clock, ManualClock, RedisClock, SystemClock
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import (
    ConfigurationError,
    CorruptEnvelope,
    DelayQueueError,
    NewerEnvelope,
    PayloadError,
    RedisOutOfMemory,
    RedisUnavailable,
    Reject,
    Retry,
    ScriptFailed,
)
from django_delayqueue.core.inspection import snapshots
from django_delayqueue.core.keys import STATES, QueueKeys
from django_delayqueue.core.logical_queue import LogicalQueue
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.results import BulkResult, Page, PeekedMessage, ScheduleResult, Snapshot
from django_delayqueue.core.settings import QueueSettings

__all__ = [
    "STATES",
    "BulkResult",
    "Clock",
    "ConfigurationError",
    "CorruptEnvelope",
    "DelayQueueError",
    "LogicalQueue",
    "ManualClock",
    "Message",
    "NewerEnvelope",
    "Page",
    "PayloadError",
    "PeekedMessage",
    "Queue",
    "QueueKeys",
    "QueueSettings",
    "RedisClock",
    "RedisOutOfMemory",
    "RedisUnavailable",
    "Reject",
    "Retry",
    "ScheduleResult",
    "ScriptFailed",
    "Snapshot",
    "SystemClock",
    "snapshots",
]
