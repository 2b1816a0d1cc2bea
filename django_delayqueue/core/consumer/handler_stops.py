"""Handlers that could not be stopped, and the watchdog's questions to the consumer.

A mixin of :class:`.loop.Consumer`. The watchdog (time limits, the end of an abort's grace)
and the coroutines' watcher run on threads of their own; when a handler does not end after its
stop they report it here, and the loop's thread, at the top of each turn
(:meth:`HandlerStops._replace_unstoppable`), asks for this process to be replaced
(:meth:`HandlerStops.replacement_needed`, a hook) and stops. Apart from :mod:`.loop` because
it is a hand-over between threads with its own lock, not a part of a round.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.consumer.limits import Run
from django_delayqueue.core.consumer.stopped import StoppedHandler
from django_delayqueue.core.consumer.threads_by_queue import ThreadsByQueue
from django_delayqueue.core.consumer.waiter import Waiter
from django_delayqueue.core.consumer.watchdog import Watchdog
from django_delayqueue.core.observability.log_fields import id_fields
from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)


class HandlerStops:
    """Takes the reports of handlers that could not be stopped and has the loop act on them."""

    stops_when_replaced: bool  # the Consumer's (class attribute)
    # The Consumer's (set in its __init__).
    name: str
    replaced_for: list[StoppedHandler]
    _queue_named: dict[str, Queue]
    _threads: ThreadsByQueue
    _waiter: Waiter
    _watchdog: Watchdog
    # Handlers that could not be stopped, for the loop's thread: runs of handler threads
    # (from the watchdog) and coroutines (from the coroutines' watcher).
    _unstoppable: list[Run]
    _unstoppable_coroutines: list[StoppedHandler]
    _unstoppable_lock: threading.Lock

    if TYPE_CHECKING:  # the Consumer's

        @property
        def stopping(self) -> bool: ...

        def request_stop(self) -> None: ...

    # --- a hook for subclasses (a supervised child) -----------------------------------------------

    def replacement_needed(self, stopped: list[StoppedHandler]) -> None:
        """Called on the loop's thread when handlers could not be stopped (their threads did
        not end): this process must be replaced for them to stop. The consumer then stops as
        on SIGTERM, leaving ``stopped`` in flight. A supervised child tells its supervisor
        (which settles them once the process is gone); alone, they stay in flight as a stop
        leaves a running handler's message (extended while the handler runs)."""
        for item in stopped:
            logger.error(
                "queue %s: the handler of message %s could not be stopped (%s): it is blocked "
                "outside Python (a socket read without a timeout, a C call). Without a "
                "supervisor to replace this process its message stays in flight, extended "
                "while the handler runs: delivered again %s after it (or this process) ends. "
                "This consumer stops; run it under runqueue's supervisor to replace it.",
                item.queue,
                item.message_id,
                item.reason,
                "a visibility timeout",
                extra=id_fields(item.queue, item.message_id, item.attempt),
            )

    # --- what the coroutines' watcher calls ------------------------------------------------------

    def _coroutines_unstoppable(self, stopped: list[StoppedHandler]) -> None:
        """From the coroutines' watcher: handlers that ignored their cancellation (or a loop
        blocked past a limit): the loop's thread asks for a replacement (_replace_unstoppable)."""
        with self._unstoppable_lock:
            self._unstoppable_coroutines.extend(stopped)
        self._waiter.nudge()

    # --- what the watchdog and the abort poller call ----------------------------------------------

    def _settings_of(self, name: str) -> Any:
        q = self._queue_named.get(name)
        return None if q is None else q.settings

    def _abort_learnt(self, run: Run) -> None:
        self._watchdog.poke()  # its grace starts now

    def _unstoppable_found(self, run: Run) -> None:
        """On the watchdog's thread: ``run`` did not end after its stop. Its outcome, should it
        come, is dropped, and it stays in flight, extended while it runs (given up on as at a
        stop); the loop's thread asks for a replacement and stops (_replace_unstoppable)."""
        if run.canceller is not None:
            return  # a coroutine: the coroutines' watcher reports it (_coroutines_unstoppable)
        threads = self._threads.get(run.message.queue)
        if threads is not None:
            threads.abandon(run.message.token)
        with self._unstoppable_lock:
            self._unstoppable.append(run)
        self._waiter.nudge()

    # --- on the loop's thread --------------------------------------------------------------------

    def _replace_unstoppable(self) -> None:
        with self._unstoppable_lock:
            found, self._unstoppable = self._unstoppable, []
            coroutines, self._unstoppable_coroutines = self._unstoppable_coroutines, []
        if not found and not coroutines:
            return
        stopped = [run.stopped_handler() for run in found] + coroutines
        self.replaced_for += stopped
        try:
            self.replacement_needed(stopped)
        except Exception:
            logger.exception("replacement_needed failed")
        if self.stops_when_replaced and not self.stopping:
            logger.warning("%s stops: a handler could not be stopped", self.name)
            self.request_stop()
