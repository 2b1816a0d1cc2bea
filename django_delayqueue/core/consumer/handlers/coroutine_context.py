"""A running coroutine handler's record, and what the handler's own asyncio task reaches of it.

Every coroutine shares the event loop's thread, so what a handler may ask about its own message
lives in context variables (set in its task by :func:`enter`), never in a thread-local:
:func:`requested_stop` (how a cancel asked it to stop), :func:`interruptible` (where its soft time
limit is raised when it waits in tasks of its own) and :func:`sync_part` (code it runs on a thread,
which keeps its message held until it ends). The work a handler's task hands to a thread through the
loop's executors is counted the same way (:mod:`.handlers.coroutine_threads`): a delivery ends only
once every thread it started has ended (:func:`hold_for_threads`). Kept apart from the runner
(:mod:`.handlers.coroutines`) because this is what the handler's side imports
(``django_delayqueue.dispatch``, the task runner), and it needs none of the loop's machinery.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.consumer.handlers.interruptible import Interruptible
from django_delayqueue.core.consumer.limits.stopped import Settlement
from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.log_fields import message_fields

if TYPE_CHECKING:
    from django_delayqueue.core.consumer.limits.runs import Run

logger = logging.getLogger(__name__)


@dataclass
class RunningCoroutine:
    message: Message
    done: Callable[[Outcome], None]
    task: asyncio.Task[None] | None = None
    body: Interruptible | None = None
    inner: list[Interruptible] = field(default_factory=list)  # see interruptible()
    stop: tuple[Settlement, str] | None = None  # how the canceller settles it
    # Its delivery's Run, once it began (the watchdog keeps its limits and times its stop
    # through it; the runner ends it with the delivery).
    run: Run | None = None
    # Work it started in threads that has not ended (sync_part, and what its task handed to
    # the loop's executors: coroutine_threads): cancelling it stops the waiting, not a thread.
    threads: int = 0
    # Its outcome, held while ``threads`` ran as it ended (hold_for_threads), given to
    # ``release`` once the last of them has ended (set by the runner as it starts).
    held: Outcome | None = None
    release: Callable[[Outcome], None] | None = None
    # Its run reached its end (the runner's ``_end``, under the runner's lock): the task's done
    # callback, which runs after, must not end it again. Its running entry is no witness: a
    # held outcome, released by its last thread, leaves the running list only a moment later.
    ended: bool = False


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


def current() -> RunningCoroutine | None:
    """The coroutine handler whose task (or a task it started) runs here, or None."""
    return _current.get()


# Guards RunningCoroutine.threads and .held: changed on the loop's thread and on the threads
# that run a delivery's work (their end may release it).
_threads_lock = threading.Lock()


def sync_part(func: Callable[..., Any]) -> Callable[..., Any]:
    """Inside a coroutine handler: ``func``, to be run on a thread, wrapped so that the
    message stays held while it runs (:func:`thread_started`): its delivery, cancelled or
    dropped with a closing loop (:meth:`HandlerCoroutines.close`), ends only once it has ended;
    until then its message stays in flight and extended, never redelivered beside code of its
    own that still runs. Call it on the loop, where the thread is started
    (``dispatch.in_thread_to_its_end``). Outside a coroutine handler, ``func`` as it is."""
    entry = _current.get()
    if entry is None:
        return func
    thread_started(entry)

    def tracked(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        finally:
            thread_ended(entry)

    return tracked


def thread_started(entry: RunningCoroutine) -> None:
    """``entry``'s delivery handed work to a thread: it ends only once :func:`thread_ended`
    was called as often (the work ended, or was cancelled before it started)."""
    with _threads_lock:
        entry.threads += 1


def thread_ended(entry: RunningCoroutine) -> None:
    """Work ``entry`` handed to a thread has ended; the last one releases the outcome held
    for it, on this thread."""
    with _threads_lock:
        entry.threads -= 1
        outcome = entry.held if entry.threads == 0 else None
        if outcome is not None:
            entry.held = None
    if outcome is None:
        return
    logger.warning(
        "message %s: the work its coroutine handler ran in a thread has ended: its delivery ends",
        entry.message.id,
        extra=message_fields(entry.message),
    )
    release = entry.release
    if release is None:  # not started by a runner (a test's own entry): nothing to tell
        return
    try:
        release(outcome)
    except Exception:
        logger.exception(
            "coroutine of message %s: not released",
            entry.message.id,
            extra=message_fields(entry.message),
        )


def hold_for_threads(entry: RunningCoroutine, outcome: Outcome) -> bool:
    """``entry``'s coroutine has ended with ``outcome``: True when work it started still runs
    in a thread (or its outcome is held already), its outcome then held until the last of it
    has ended (:func:`thread_ended` gives it to ``entry.release``); False when nothing holds it.
    A thread cannot be stopped: what a thread of a delivery still runs must never run beside
    the delivery's retry, so the delivery stays running (in flight, extended) meanwhile."""
    with _threads_lock:
        if entry.held is not None:
            return True  # it ended before: its first outcome stays
        if entry.threads <= 0:
            return False
        entry.held = outcome
        running = entry.threads
    logger.warning(
        "message %s: its coroutine handler ended (%s) while %d thread(s) it started still run: "
        "kept in flight until they end",
        entry.message.id,
        outcome.reason or outcome.status,
        running,
        extra=message_fields(entry.message),
    )
    return True
