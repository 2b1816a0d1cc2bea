"""Learning which running messages were aborted (``dq.abort``, the admin's "Stop").

``abort.lua`` records an abort in the queue's ``aborts`` hash (id -> "<token> <reason>") and
announces it on the queue's wake channel. The :class:`AbortPoller` thread reads the hash for
the messages this consumer runs: at once when an abort is announced, and about once a second
while handlers run, in case the announcement was missed (one round trip per Redis client, and
none while nothing runs). What it learns goes to the runs (``message.aborted``,
``dq.abort_requested()``) and wakes the watchdog, which stops a handler still running once its
queue's ``abort_grace_seconds`` are over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from django_delayqueue.core.consumer.limits import Run, Runs
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import redis_errors

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # while handlers run: the longest an abort waits to be learnt
ANNOUNCED_GAP_SECONDS = 0.05  # announcements bring a read at most this often
# What abort.lua publishes on the wake channel (a due time is a number: never this).
ANNOUNCEMENT = "abort"


def parse_abort(value: Any) -> tuple[str, str] | None:
    """An ``aborts`` hash value as (token, reason); None for a missing or unreadable one."""
    if value is None:
        return None
    token, _, reason = to_str(value).partition(" ")
    return (token, reason) if token else None


def read_aborts(queues: Mapping[str, Queue], runs: list[Run]) -> list[tuple[Run, str]]:
    """The runs among ``runs`` whose delivery was aborted, with the abort's reason (one round
    trip per Redis client). Raises :class:`RedisUnavailable`."""
    by_queue: dict[str, list[Run]] = {}
    for run in runs:
        if run.message.queue in queues and not run.aborted:
            by_queue.setdefault(run.message.queue, []).append(run)
    by_client: dict[int, tuple[Any, list[list[Run]]]] = {}
    for name, queue_runs in by_queue.items():
        client = queues[name].client
        pipe, parts = by_client.setdefault(id(client), (client.pipeline(transaction=False), []))
        pipe.hmget(queues[name].keys.aborts, [r.message.id for r in queue_runs])
        parts.append(queue_runs)
    found: list[tuple[Run, str]] = []
    for pipe, parts in by_client.values():
        with redis_errors("reading aborts"):
            replies = pipe.execute()
        for queue_runs, values in zip(parts, replies, strict=True):
            for run, value in zip(queue_runs, values, strict=True):
                parsed = parse_abort(value)
                if parsed is not None and parsed[0] == run.message.token:
                    found.append((run, parsed[1]))
    return found


class AbortPoller:
    """A thread that learns the aborts of ``runs`` (see the module's docstring)."""

    def __init__(
        self,
        queues: Callable[[], Mapping[str, Queue]],
        runs: Runs,
        on_abort: Callable[[Run], None],
        poll_seconds: float = POLL_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._monotonic = monotonic
        self._queues = queues
        self._runs = runs
        self._on_abort = on_abort
        self._poll = poll_seconds
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AbortPoller:
        self._thread = threading.Thread(target=self._run, name="delayqueue-aborts", daemon=True)
        self._thread.start()
        return self

    def announced(self) -> None:
        """An abort was announced on a wake channel: read now."""
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self._poll)
            self._wake.clear()
            if self._stopped.is_set():
                return
            self.poll_once()
            self._stopped.wait(ANNOUNCED_GAP_SECONDS)

    def poll_once(self) -> int:
        """Read the aborts of the running handlers now; returns how many were new."""
        runs = self._runs.all()
        if not runs:
            return 0
        try:
            found = read_aborts(self._queues(), runs)
        except Exception as e:  # Redis down: the next poll tries again
            logger.debug("aborts not read: %s", e)
            return 0
        now = self._monotonic()
        new = 0
        for run, reason in found:
            if run.learn_abort(reason, now):
                new += 1
                logger.warning(
                    "queue %s: message %s aborted%s while its handler runs",
                    run.message.queue,
                    run.message.id,
                    f" ({reason})" if reason else "",
                )
                self._on_abort(run)
        return new
