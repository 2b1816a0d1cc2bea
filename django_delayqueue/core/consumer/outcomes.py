"""What happened to one delivery, and how that becomes an ack, a nack or a journal entry."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from types import CoroutineType
from typing import Any

from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import Reject, Retry
from django_delayqueue.core.journal import ACK, GARBAGE, RETRY, OutcomeStatus
from django_delayqueue.core.observability.log_fields import message_fields
from django_delayqueue.core.observability.tracing import EndedLater, record_failure
from django_delayqueue.core.scripts.calls import ScriptCall

logger = logging.getLogger(__name__)


class WhileRunning:
    """A write a handler wants sent with the consumer's next round trip if it still runs by
    then (``Consumer.write_soon``): a task's RUNNING. One that ends first sets ``ended`` and
    the write is never built: its outcome's writes say it all (most tasks end before the next
    round). The loop builds it with :meth:`call` (on its thread) and keeps it in ``taken``.
    Handed over and ended without a lock: a dict entry and an attribute, each set at once."""

    ended: bool = False
    taken: ScriptCall | None = None

    def call(self) -> ScriptCall:
        raise NotImplementedError


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, about
# 1 us a task on a worker (one is made per task run); nothing changes one once it is returned.
@dataclass(eq=False, slots=True)
class WritesWithAck:
    """What a handler that succeeded leaves for the consumer to write with the delivery's ack.

    Returned by the handler: ``call`` (a script call on the message's queue, such as a task's
    result) is sent in the same round trip as the ack, before it, so it costs no round trip
    of its own and a worker that dies before the ack leaves neither. ``then`` runs on the
    consumer's thread once Redis has it, with the call's reply (a task's ``task_finished``
    signal, or its record written again whole), never raising.
    """

    call: ScriptCall
    then: Callable[[Any], None] | None = None
    # A call the handler gave ``Consumer.write_soon`` (or one the loop built of its
    # ``WhileRunning``) that ``call`` makes needless (it writes the same and more): not sent if
    # it is still waiting when this one goes.
    supersedes: ScriptCall | None = None
    # The delivery was found already done (an atomic queue's inbox row: its transaction
    # committed before, its ack was lost): acknowledged, and journalled as ALREADY_DONE.
    already_done: bool = False


@dataclass
class Outcome:
    message: Message
    status: OutcomeStatus
    started_ms: int
    finished_ms: int
    delay: float | None = None  # retry delay the handler asked for (None: backoff)
    reason: str = ""
    error: str = ""  # exception class, for the journal
    writes: WritesWithAck | None = None  # what the handler left to write with the ack
    # How long a flow limit held the due message back before its claim (ms), set as the
    # consumer counts the outcome (core.timings.recorder): the journal row carries it, so that
    # reports do not count it as lateness.
    limit_wait_ms: int = 0
    # A failure's delivery span (tracing on), ended by the consumer once its nack replied.
    span: EndedLater | None = field(default=None, compare=False, repr=False)

    def journal_row(self, max_attempts: int | None = None) -> list[Any]:
        """The journal's row; a failure on the last of ``max_attempts`` reads "garbage".

        nack.lua sends such a failure to the dead letters (whatever retry was asked), so the
        journal, which queuestats and the metrics count, must say so too.
        """
        m = self.message
        status = self.status
        if status == RETRY and max_attempts is not None and m.attempt >= max_attempts:
            status = GARBAGE
        return [
            m.id,
            m.scheduled_ms,
            m.due_ms,
            self.started_ms,
            self.finished_ms,
            m.attempt,
            status,
            self.error,
            self.limit_wait_ms,
        ]


ABORTED = "Aborted"  # the error an aborted delivery's outcome names (dq.Aborted)
# The error an acknowledged delivery's journal row names when its handler did not run because
# the delivery was already done (docs/exactly-once.md): counted apart by stats.lua.
ALREADY_DONE = "AlreadyDone"


class AlreadyDone:
    """What a handler returns for a delivery it found already done and did not run (a
    task's handler returns a WritesWithAck with ``already_done`` instead: its record to write)."""


SKIPPED_AS_DONE = AlreadyDone()


def aborted_outcome(outcome: Outcome, reason: str) -> Outcome:
    """``outcome`` as an aborted delivery's: the dead letters with ``reason`` (the abort's),
    whatever its handler did (returned, raised, asked for a retry, was stopped at a limit)."""
    return replace(outcome, status=GARBAGE, delay=None, reason=reason, error=ABORTED, writes=None)


def is_aborted(outcome: Outcome) -> bool:
    """Whether ``outcome`` was settled as an abort's (:func:`aborted_outcome`)."""
    return outcome.status == GARBAGE and outcome.error == ABORTED


def run_handler(handler: Callable[[Message], Any], message: Message, now_ms: int) -> Outcome:
    """Call ``handler`` and turn what it did into an :class:`Outcome` (never raises)."""
    t0 = time.perf_counter()
    try:
        returned = handler(message)
        # Never awaited here, it must not pass for an ack (isinstance: what
        # inspect.iscoroutine does, without a call per message).
        if returned is not None and isinstance(returned, CoroutineType):
            returned.close()
            raise TypeError("the handler returned a coroutine on a handler thread")
    except BaseException as e:  # SystemExit, CancelledError, ...: a failed attempt too
        return failed_outcome(message, e, now_ms, t0)
    # returned_outcome(), inlined (this runs for every message), None first (most handlers).
    finished = now_ms + int((time.perf_counter() - t0) * 1000)
    if returned is None:
        return Outcome(message, ACK, now_ms, finished)
    if isinstance(returned, WritesWithAck):
        if returned.already_done:
            return _already_done(message, returned, now_ms, finished)
        return Outcome(message, ACK, now_ms, finished, None, "", "", returned)
    if isinstance(returned, AlreadyDone):
        return _already_done(message, None, now_ms, finished)
    return Outcome(message, ACK, now_ms, finished)


async def run_coroutine_handler(
    handler: Callable[[Message], Awaitable[Any]], message: Message, now_ms: int
) -> Outcome:
    """Await ``handler`` and turn what it did into an :class:`Outcome` (never raises: a
    CancelledError is a failed attempt like any other exception, and ends here)."""
    t0 = time.perf_counter()
    try:
        returned = await handler(message)
    except GeneratorExit:  # the coroutine is being closed (its loop is gone): not an outcome
        raise
    except BaseException as e:
        return failed_outcome(message, e, now_ms, t0)
    return returned_outcome(message, returned, now_ms, t0)


def returned_outcome(message: Message, returned: Any, started: int, t0: float) -> Outcome:
    """The outcome of a handler that returned ``returned`` (started at ``started`` ms and at
    ``t0``, ``time.perf_counter()``): an ack, with the writes it left."""
    finished = started + int((time.perf_counter() - t0) * 1000)
    if isinstance(returned, AlreadyDone):
        return _already_done(message, None, started, finished)
    writes = returned if isinstance(returned, WritesWithAck) else None
    if writes is not None and writes.already_done:
        return _already_done(message, writes, started, finished)
    return Outcome(message, ACK, started, finished, writes=writes)


def _already_done(
    message: Message, writes: WritesWithAck | None, started: int, finished: int
) -> Outcome:
    """The ack of a delivery whose handler did not run: it was done before. Its journal row
    says ALREADY_DONE; a task's record (``writes``) is written with the ack."""
    return Outcome(message, ACK, started, finished, None, "already done", ALREADY_DONE, writes)


def failed_outcome(message: Message, e: BaseException, started: int, t0: float) -> Outcome:
    """The outcome of a handler that raised ``e``: Retry and Reject as they ask, anything else
    (even a BaseException) a failed attempt, retried with backoff."""
    record_failure(e)  # on the delivery span, when tracing is on
    if isinstance(e, Retry):
        status, reason, error = RETRY, e.reason or "retry requested", "Retry"
        delay = _sane_delay(e.delay)
    elif isinstance(e, Reject):
        status, delay, reason, error = GARBAGE, None, e.reason, "Reject"
    else:
        # A handler's failure is data, never a crash of the loop: even a BaseException only
        # fails this attempt (retry with backoff, dead letters when attempts run out).
        status, delay, error = RETRY, None, type(e).__name__
        if not isinstance(e, Exception):  # past every `except Exception`: say it here
            logger.warning(
                "queue %s: handler raised %s on message %s (attempt %d)",
                message.queue,
                error,
                message.id,
                message.attempt,
                exc_info=e,
                extra=message_fields(message),
            )
        reason = f"{error}: {e}"[:2000]
    finished = started + int((time.perf_counter() - t0) * 1000)
    return Outcome(message, status, started, finished, delay, reason, error)


def _sane_delay(delay: Any) -> float | None:
    """A retry delay the nack can use, or None (backoff) for one that is not a finite number >= 0.

    Retry() refuses such values when raised; this also covers one set on the exception
    afterwards, so one bad value costs one message a backoff, never the consumer its loop.
    """
    try:
        seconds = float(delay)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def journal_entry(outcomes: list[Outcome], max_attempts: int | None = None) -> dict[str, str]:
    rows = [o.journal_row(max_attempts) for o in outcomes]
    return {"n": str(len(rows)), "o": json.dumps(rows, separators=(",", ":"))}
