"""The few exceptions of django-delayqueue, all under one base."""

from __future__ import annotations

import math
import numbers
from datetime import timedelta
from decimal import Decimal


class DelayQueueError(Exception):
    """Base class of every error raised by django-delayqueue."""


class ConfigurationError(DelayQueueError, ValueError):
    """A queue name, prefix or setting is invalid."""


class PayloadError(DelayQueueError, ValueError):
    """A payload, message id or due time cannot be scheduled (not JSON, too large, ...)."""


class CorruptEnvelope(DelayQueueError):
    """An envelope read from Redis is not what this library wrote."""


class NewerEnvelope(CorruptEnvelope):
    """An envelope written in a format newer than this reader reads (a later release's).

    Not corrupt: a consumer that reads ``format`` will deliver it. A consumer leaves such a
    message for one (``Queue.leave_for_newer``) instead of sending it to the dead letters;
    everything else that only shows an envelope treats it as one it cannot decode (it is a
    :class:`CorruptEnvelope` for them). ``reads``: the newest format this reader reads.
    """

    def __init__(self, format: int, reads: int) -> None:
        super().__init__(
            f"envelope format {format} is newer than this reader reads (formats up to {reads})"
        )
        self.format = format
        self.reads = reads


class RedisUnavailable(DelayQueueError):
    """Redis could not be reached or timed out; the operation may be retried."""


class NotReplicated(RedisUnavailable):
    """A write reached the primary, but fewer replicas than required confirmed it in time.

    With ``MIN_REPLICAS`` a schedule raises this rather than return: the message is on the
    primary (``result`` says what the write did) but would be lost if it failed over now. Do
    not simply schedule it again: once delivered and acknowledged its id is free, and a second
    message would be created. Inside a transaction the outbox retries it safely, under its
    row's token.
    """

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result


class RedisOutOfMemory(RedisUnavailable):
    """Redis refused a write because its memory is full (``used_memory`` above ``maxmemory``,
    with the ``noeviction`` policy): nothing of the refused call was changed.

    Retry once memory is freed: consumers keep delivering and acknowledging (which frees
    memory) while the server is full; raising ``maxmemory`` helps at once (docs/redis.md).
    """


class ScriptFailed(DelayQueueError):
    """A Lua script raised an error (for example a key holds the wrong type)."""


# The longest retry delay a handler may ask for (100 years): far beyond any sane wait, and its
# retry time stays well inside the milliseconds a double holds exactly.
MAX_RETRY_DELAY_SECONDS = 3_155_760_000


class Retry(DelayQueueError):
    """Raised by a handler to ask for another attempt after ``delay`` seconds.

    ``delay`` (seconds or a timedelta; None: the queue's backoff) is checked here, so a bad
    one (inf, nan, negative, 1e300, not a number) raises ValueError in the handler, which then
    counts as an ordinary failure, instead of reaching the consumer as a retry time that can
    never be recorded.
    """

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        super().__init__(reason or "retry requested")
        self.delay = None if delay is None else _retry_seconds(delay)
        self.reason = reason


def _retry_seconds(delay: object) -> float:
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (numbers.Real, Decimal)) and not isinstance(delay, bool):
        try:
            seconds = float(delay)
        except OverflowError:  # an int beyond a float
            seconds = math.inf
    else:
        raise ValueError(f"Retry delay must be seconds or a timedelta, not {delay!r}")
    if not 0 <= seconds <= MAX_RETRY_DELAY_SECONDS:  # false for nan as well
        raise ValueError(
            f"Retry delay must be between 0 and {MAX_RETRY_DELAY_SECONDS} seconds, not {delay!r}"
        )
    return seconds


class Reject(DelayQueueError):
    """Raised by a handler to send the message straight to the dead letters."""

    def __init__(self, reason: str = "rejected by handler") -> None:
        super().__init__(reason)
        self.reason = reason


# --- what the consumer raises inside a handler it stops (core.consumer.limits) ---------------
# Raised in the handler's thread by the consumer (PyThreadState_SetAsyncExc raises the class,
# with no arguments): the consumer notes the reason under the thread's id just before, and
# the exception takes it as its message.
_stop_reasons: dict[int, str] = {}


def _noted_reason(default: str) -> str:
    import threading

    return _stop_reasons.get(threading.get_ident(), default)


class SoftTimeLimitExceeded(Exception):
    """Raised inside a handler that ran past its queue's ``soft_time_limit``: clean up and
    return or raise (either is treated as usual). Raised once; ``time_limit`` still applies."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (_noted_reason("soft time limit exceeded"),)))


class HandlerStopped(BaseException):
    """Raised inside a handler the consumer stops (a BaseException: ``except Exception`` in
    the handler does not swallow it). Whatever the handler does after it, its message's
    outcome is the stop's: a retry for a time limit, the dead letters for an abort."""

    default = "handler stopped"

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (_noted_reason(self.default),)))


class TimeLimitExceeded(HandlerStopped):
    """Raised inside a handler that ran past its queue's ``time_limit``: its message is
    retried with the reason "time limit exceeded (N s)" (an attempt counts)."""

    default = "time limit exceeded"


class Aborted(HandlerStopped):
    """Raised inside a handler whose message was aborted (``dq.abort``) and that did not stop
    within ``abort_grace_seconds``: the message goes to the dead letters."""

    default = "aborted"
