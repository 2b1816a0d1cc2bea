"""The few exceptions of django-delayqueue, all under one base."""

from __future__ import annotations


class DelayQueueError(Exception):
    """Base class of every error raised by django-delayqueue."""


class ConfigurationError(DelayQueueError, ValueError):
    """A queue name, prefix or setting is invalid."""


class PayloadError(DelayQueueError, ValueError):
    """A payload, message id or due time cannot be scheduled (not JSON, too large, ...)."""


class CorruptEnvelope(DelayQueueError):
    """An envelope read from Redis is not what this library wrote."""


class RedisUnavailable(DelayQueueError):
    """Redis could not be reached or timed out; the operation may be retried."""


class ScriptFailed(DelayQueueError):
    """A Lua script raised an error (for example a key holds the wrong type)."""


class Retry(DelayQueueError):
    """Raised by a handler to ask for another attempt after ``delay`` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        super().__init__(reason or "retry requested")
        self.delay = delay
        self.reason = reason


class Reject(DelayQueueError):
    """Raised by a handler to send the message straight to the dead letters."""

    def __init__(self, reason: str = "rejected by handler") -> None:
        super().__init__(reason)
        self.reason = reason
