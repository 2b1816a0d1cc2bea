"""Handlers that could not be stopped, handed from the threads that find them to the loop's.

The watchdog (time limits, the end of an abort's grace) runs on a thread of its own; when a
handler (a thread, or a coroutine's delivery) does not end after its stop it reports it to
:class:`Unstoppable`, and the loop's thread, at the top of each turn, takes the reports
(:meth:`Unstoppable.take`), asks for this process to be replaced
(``Consumer.replacement_needed``, a hook) and stops. Apart from :mod:`.loop` because it is a
hand-over between threads with its own lock, not a part of a round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django_delayqueue.core.consumer.limits.runs import Run
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.log_fields import id_fields, message_fields

logger = logging.getLogger(__name__)


class Unstoppable:
    """Reports of handlers that did not end after their stop, for the loop's thread.

    ``abandon(message)`` gives a handler thread's message up (its outcome, should it come, is
    dropped); ``nudge()`` wakes the loop so that it takes the report at once.
    """

    def __init__(self, abandon: Callable[[Message], None], nudge: Callable[[], None]) -> None:
        self._abandon = abandon
        self._nudge = nudge
        self._lock = threading.Lock()
        self._runs: list[Run] = []  # from the watchdog: handler threads' and coroutines'

    def run_found(self, run: Run) -> None:
        """On the watchdog's thread: ``run`` did not end after its stop. A handler thread's
        outcome, should it come, is dropped, and it stays in flight, extended while it runs
        (given up on as at a stop); a coroutine's delivery stays running, its outcome recorded
        should it end (it never ends beside its retry: only once every thread it started has
        ended). The loop's thread asks for a replacement and stops."""
        if run.stopper is None:
            self._abandon(run.message)
        else:
            logger.error(
                "queue %s: the coroutine handler of message %s did not end when cancelled (it "
                "catches CancelledError, blocks the event loop, or a thread it started still "
                "runs): this process must be replaced for it to stop",
                run.message.queue,
                run.message.id,
                extra=message_fields(run.message),
            )
        with self._lock:
            self._runs.append(run)
        self._nudge()

    def take(self) -> list[StoppedHandler]:
        """On the loop's thread: what was reported since the last take."""
        with self._lock:
            found, self._runs = self._runs, []
        return [run.stopped_handler() for run in found]


def log_unstoppable(stopped: list[StoppedHandler]) -> None:
    """What a consumer without a supervisor says of handlers it could not stop."""
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
