"""A running coroutine handler's record, and what the handler's own asyncio task reaches of it.

Every coroutine shares the event loop's thread, so what a handler may ask about its own message
lives in context variables (set in its task by :func:`enter`), never in a thread-local:
:func:`requested_stop` (how a cancel asked it to stop), :func:`interruptible` (where its soft
time limit is raised when it waits in tasks of its own) and :func:`sync_part` (code it runs on a
thread, which keeps its message held until it ends). Kept apart from the runner
(:mod:`.handler_coroutines`) because this is what the handler's side imports
(``django_delayqueue.dispatch``, the task runner), and it needs none of the loop's machinery.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core.consumer.interruptible import Interruptible
from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.consumer.stopped import Settlement
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.log_fields import message_fields

logger = logging.getLogger(__name__)


@dataclass
class RunningCoroutine:
    message: Message
    done: Callable[[Outcome], None]
    started: float  # time.monotonic()
    soft_limit: float | None
    hard_limit: float | None
    task: asyncio.Task[None] | None = None
    body: Interruptible | None = None
    inner: list[Interruptible] = field(default_factory=list)  # see interruptible()
    soft_sent: bool = False
    stop: tuple[Settlement, str] | None = None  # how the canceller settles it
    stop_sent_at: float | None = None
    reported: bool = False  # as unstoppable
    # Its sync code running on a thread (sync_part): a thread outlives a closed loop.
    sync_parts: int = 0
    # Dropped with the loop while sync_parts ran: given to ``done`` once they have ended.
    held: Outcome | None = None


# The interruptibles of the message whose context this is (a list shared with the tasks it
# starts, which copy the context): where the soft time limit is raised.
_soft_targets: contextvars.ContextVar[list[Interruptible] | None] = contextvars.ContextVar(
    "delayqueue_soft_targets", default=None
)


_current: contextvars.ContextVar[RunningCoroutine | None] = contextvars.ContextVar(
    "delayqueue_current_coroutine", default=None
)


def enter(entry: RunningCoroutine) -> None:
    """In the task that runs ``entry``'s handler (its own context: this message only)."""
    _soft_targets.set(entry.inner)
    _current.set(entry)


def requested_stop() -> tuple[Settlement, str] | None:
    """Inside a coroutine handler: how :meth:`HandlerCoroutines.cancel` asked it to stop
    ("retry" or "dead", and the reason), or None (not stopped, or not a coroutine handler).
    What it records (a task's result) follows it: an aborted task reads FAILED."""
    entry = _current.get()
    return None if entry is None else entry.stop


def interruptible(coro: Awaitable[Any]) -> Awaitable[Any]:
    """Await ``coro`` through this so that the soft time limit of the message being handled is
    raised inside it (``SoftTimeLimitExceeded`` at its await), though it runs in a task of its
    own: ``asyncio.gather`` of several receivers puts each in a task, and cancelling the gather
    would only cancel them. Outside a coroutine handler, ``coro`` as it is."""
    targets = _soft_targets.get()
    if targets is None:
        return coro
    body = Interruptible(coro)
    targets.append(body)
    return body


# Guards RunningCoroutine.sync_parts and .held: changed on the loop's thread, on the threads
# running the sync parts, and on the loop's thread as it ends (release_after_sync_parts).
_sync_lock = threading.Lock()


def sync_part(func: Callable[..., Any]) -> Callable[..., Any]:
    """Inside a coroutine handler: ``func``, to be run on a thread, wrapped so that the
    message stays held while it runs. A coroutine dropped with a closing loop
    (:meth:`HandlerCoroutines.close`) is released only once its sync parts have ended: until
    then its message stays given up on and extended (``Extender.linger``), never redelivered
    beside code of its own that still runs. Call it on the loop, where the thread is started
    (``dispatch.in_thread_to_its_end``). Outside a coroutine handler, ``func`` as it is."""
    entry = _current.get()
    if entry is None:
        return func
    with _sync_lock:
        entry.sync_parts += 1

    def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        finally:
            _sync_part_ended(entry)

    return tracked


def _sync_part_ended(entry: RunningCoroutine) -> None:
    with _sync_lock:
        entry.sync_parts -= 1
        outcome = entry.held if entry.sync_parts == 0 else None
        entry.held = None if outcome is not None else entry.held
    if outcome is not None:
        logger.warning(
            "message %s: the sync part of its coroutine handler ended after the event loop: "
            "released, it comes back after its visibility timeout",
            entry.message.id,
            extra=message_fields(entry.message),
        )
        release(entry, outcome)


def release_after_sync_parts(entry: RunningCoroutine, outcome: Outcome) -> None:
    """``entry`` was dropped with its loop: released now, or (its sync part still runs on its
    thread) once that has ended."""
    with _sync_lock:
        held = entry.sync_parts > 0
        if held:
            entry.held = outcome
    if held:
        logger.warning(
            "message %s: its coroutine handler's sync part still runs on its thread: "
            "kept in flight until it ends",
            entry.message.id,
            extra=message_fields(entry.message),
        )
        return
    release(entry, outcome)


def release(entry: RunningCoroutine, outcome: Outcome) -> None:
    try:
        entry.done(outcome)
    except Exception:
        logger.exception(
            "coroutine of message %s: not released",
            entry.message.id,
            extra=message_fields(entry.message),
        )
