"""The Django-free engine: importable by a Spark executor or a plain script."""

from .clock import Clock, ManualClock, RedisClock, SystemClock
from .envelope import Message
from .errors import (
    ConfigurationError,
    CorruptEnvelope,
    DelayQueueError,
    PayloadError,
    RedisUnavailable,
    Reject,
    Retry,
    ScriptFailed,
)
from .inspection import snapshots
from .keys import STATES, QueueKeys
from .queue import Queue
from .results import BulkResult, Page, PeekedMessage, ScheduleResult, Snapshot
from .settings import QueueSettings

__all__ = [
    "STATES",
    "BulkResult",
    "Clock",
    "ConfigurationError",
    "CorruptEnvelope",
    "DelayQueueError",
    "ManualClock",
    "Message",
    "Page",
    "PayloadError",
    "PeekedMessage",
    "Queue",
    "QueueKeys",
    "QueueSettings",
    "RedisClock",
    "RedisUnavailable",
    "Reject",
    "Retry",
    "ScheduleResult",
    "ScriptFailed",
    "Snapshot",
    "SystemClock",
    "snapshots",
]
