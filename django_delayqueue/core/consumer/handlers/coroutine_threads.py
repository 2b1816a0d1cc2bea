"""The threads of the coroutine handlers' event loop, each piece of work counted as its delivery's.

Cancelling a coroutine that awaits work in a thread (a time limit, an abort) stops the waiting,
not the thread: the work goes on. Were the delivery to end there, its message would be retried
(or dead-lettered, and requeued) while that work still runs: two runs of one message at once.
So the loop runs such work in executors of its own (:func:`install`):

- its default executor: ``asyncio.to_thread``, ``loop.run_in_executor(None, ...)``, asgiref's
  ``sync_to_async(thread_sensitive=False)`` and what else asyncio runs in it;
- the one thread of asgiref's thread-sensitive calls made on this loop (``sync_to_async`` by
  default, Django's async ORM methods): one thread for them, as asgiref's own would be.

Work handed to either from a coroutine handler's task (or a task it started: they share its
context) counts as its delivery's (``coroutine_context.thread_started``) until it has ended, or
was cancelled before it started. The runner (:mod:`.handlers.coroutines`) holds the delivery's
outcome until then: it stays running, in flight and extended, and a thread that does not end
soon after a stop makes it unstoppable, reported as a thread handler's is (its process is
replaced). Work handed over outside a handler (the consumer's own) counts for nothing.

An executor passed by name (``run_in_executor(my_pool, ...)``, ``sync_to_async(executor=...)``)
is the handler's own, and is not watched: its work is the handler's business.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from django_delayqueue.core.consumer.handlers.coroutine_context import (
    current,
    thread_ended,
    thread_started,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DeliveryThreads(ThreadPoolExecutor):
    """A thread pool whose work, when handed over by a coroutine handler, counts as its
    delivery's until it has ended (or was cancelled before it started)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        entry = current()
        if entry is None:  # not a handler's: the consumer's own
            return super().submit(fn, *args, **kwargs)
        thread_started(entry)  # before the work can start, so it never ends uncounted
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:  # shut down (the loop closes): the work never runs
            thread_ended(entry)
            raise
        # Called once the work has ended, or at once if it was cancelled before it started
        # (a future that runs cannot be cancelled): the thread is done with this delivery.
        future.add_done_callback(lambda _: thread_ended(entry))
        return future


def install(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Give ``loop`` (the coroutine handlers', before it runs) its executors; returns what
    undoes it as the loop closes (the threads still running are left to end on their own)."""
    loop.set_default_executor(DeliveryThreads(thread_name_prefix="delayqueue-async-thread"))
    sensitive = DeliveryThreads(max_workers=1, thread_name_prefix="delayqueue-async-sensitive")
    by_loop = _asgiref_loop_executors()
    if by_loop is not None:
        by_loop[loop] = sensitive

    def uninstall() -> None:
        if by_loop is not None and by_loop.get(loop) is sensitive:
            del by_loop[loop]
        sensitive.shutdown(wait=False)

    return uninstall


def _asgiref_loop_executors() -> dict[Any, Any] | None:
    """asgiref's executors for thread-sensitive calls, by event loop: a ``sync_to_async`` call
    on a loop found there runs in its executor rather than asgiref's process-wide thread (what
    ``async_to_sync`` registers for the loops it makes). None without asgiref (a core without
    Django), or an asgiref that has no such table (its thread-sensitive calls then go unwatched)."""
    try:
        from asgiref.sync import AsyncToSync
    except ImportError:
        return None
    table = getattr(AsyncToSync, "loop_thread_executors", None)
    if not isinstance(table, dict):
        logger.warning(
            "asgiref has no loop_thread_executors: thread-sensitive sync_to_async calls of "
            "coroutine handlers are not held to their delivery"
        )
        return None
    return table
