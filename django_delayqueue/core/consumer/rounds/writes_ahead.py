"""Task results sent beside a round trip, not in it: Redis writes them while the loop decodes.

A task that returns leaves its result to write before its message is acked (``WritesWithAck``).
Sent in the round trip's pipeline, before the acks, that write is Redis's largest share of a
task's round (its record's ``HMGET``, ``HSET`` and ``EXPIRE``, about 20 us a task in a burst of
20,000), and the loop waits it out with nothing else to do: the loop is the slower stage of
the consumer's pipeline, so its handler thread has finished what it holds by then (issue 37,
``bench.consumer_cpu --split``). So a round hands the results it took to this part's thread,
which sends them as one pipeline of its own as the loop sends the round trip's (as soon as
the loop's thread waits for Redis and lets it run): Redis writes them while the loop reads its
reply, decodes the claimed messages and hands them over. The two pipelines are not ordered
with each other, so a write on a key one of the round's early calls (``write_soon``) writes
goes in the round trip, after it, as before. Their messages are acked by a later round, once
this thread has read that Redis has their results: a result still lands before its ack, and an
outcome stays unrecorded (its message in flight, extended) until then.

One thread per consumer, started with the first results sent ahead; the loop's thread hands it
calls and takes its replies (:meth:`collect`), and nudges itself a round when a send is done
(``wake``), so that a burst's last acks go at once rather than at the next poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.scripts.calls import ScriptBatch, ScriptCall

logger = logging.getLogger(__name__)

# A job: the calls of one Redis server's queues (each with what the caller keeps to read its
# reply), sent as one pipeline. Done: the same with the replies, or the error for them all.
Job = tuple[RedisClient, list[tuple[ScriptCall, Any]]]
Done = tuple[list[tuple[ScriptCall, Any]], list[Any] | DelayQueueError]


class WritesAhead:
    """Sends handlers' writes on a thread of its own; the loop collects the replies."""

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self._wake = wake
        self._cond = threading.Condition()
        self._todo: list[Job] = []
        self._done: list[Done] = []
        self._sending = 0  # jobs taken by the thread and not done yet
        self._thread: threading.Thread | None = None
        self._closed = False

    def send(self, client: RedisClient, calls: list[tuple[ScriptCall, Any]]) -> None:
        """Send ``calls`` (each with what it carries) on ``client``, as soon as possible."""
        if not calls:
            return
        with self._cond:
            self._closed = False
            if self._thread is None:  # none yet, or it ended (closed): a new one
                thread = threading.Thread(
                    target=self._serve, name="delayqueue-writes-ahead", daemon=True
                )
                thread.start()  # raises before the job is taken: the caller sends it again
                self._thread = thread
            self._todo.append((client, calls))
            self._cond.notify()

    def pending(self) -> bool:
        """Whether calls were handed over and their replies not collected yet."""
        with self._cond:
            return bool(self._todo or self._sending or self._done)

    def replied(self) -> bool:
        """Whether replies wait for :meth:`collect` (a round is due to take them)."""
        with self._cond:
            return bool(self._done)

    def wait_sent(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for everything handed over to be sent and replied to (at a
        stop, before its last rounds); whether it was."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._todo or self._sending), seconds)

    def collect(self, wait_seconds: float = 0.0) -> list[Done]:
        """The sends done since the last call, in order; first waiting up to ``wait_seconds``
        for those handed over to be done (:meth:`wait_sent`)."""
        if wait_seconds > 0:
            self.wait_sent(wait_seconds)
        with self._cond:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """End the thread once what it was handed is sent (its replies stay to collect)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._todo or self._closed)
                if not self._todo:
                    self._thread = None  # under the lock: a later send starts another
                    return
                jobs, self._todo = self._todo, []
                self._sending = len(jobs)
            for client, calls in jobs:
                batch = ScriptBatch([call for call, _ in calls])
                try:
                    results: list[Any] | DelayQueueError = batch.run(client, raise_errors=False)
                except DelayQueueError as e:  # an outage: the loop sends them again
                    results = e
                except Exception as e:  # never this thread's end: the loop sends them again
                    logger.exception("task results sent ahead of their acks failed")
                    results = DelayQueueError(f"sending task results failed: {e!r}")
                with self._cond:
                    self._done.append((calls, results))
                    self._sending -= 1
                    self._cond.notify_all()
            if self._wake is not None:
                try:
                    self._wake()
                except Exception:  # a round comes at the next poll all the same
                    logger.exception("could not wake the consumer's loop")
