"""Learning which running messages were aborted (``dq.abort``, the admin's "Stop").

``abort.lua`` records an abort in the queue's ``aborts`` hash (id -> "<token> <reason>") and
announces it on the queue's wake channel. The :class:`AbortPoller` thread reads the hash for
the messages this consumer runs: at once when an abort is announced, and about once a second
while handlers run, in case the announcement was missed (one round trip per Redis client, and
none while nothing runs). What it learns goes to the runs (``message.aborted``,
``dq.abort_requested()``; a handler thread without a Run, its queue having no time limit, is
given one now: ``Runs.adopt``) and wakes the watchdog, which stops a handler still running once its
queue's ``abort_grace_seconds`` are over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django_delayqueue.core.consumer.limits.runs import Run, Runs, Slot
from django_delayqueue.core.envelope import Message, to_str
from django_delayqueue.core.observability.log_fields import message_fields
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import redis_errors

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # while handlers run: the longest an abort waits to be learnt
ANNOUNCED_GAP_SECONDS = 0.05  # announcements bring a read at most this often
# What abort.lua publishes on the wake channel (a due time is a number: never this).
ANNOUNCEMENT = "abort"

T = TypeVar("T")


def parse_abort(value: Any) -> tuple[str, str] | None:
    """An ``aborts`` hash value as (token, reason); None for a missing or unreadable one."""
    if value is None:
        return None
    token, _, reason = to_str(value).partition(" ")
    return (token, reason) if token else None


def read_aborts(
    queues: Mapping[str, Queue], running: list[tuple[Message, T]]
) -> list[tuple[Message, T, str]]:
    """The messages among ``running`` (each with what stands for its handler) whose delivery
    was aborted, with the abort's reason (one round trip per Redis client). Raises
    :class:`RedisUnavailable`."""
    by_queue: dict[str, list[tuple[Message, T]]] = {}
    for item in running:
        if item[0].queue in queues:
            by_queue.setdefault(item[0].queue, []).append(item)
    by_client: dict[int, tuple[Any, list[list[tuple[Message, T]]]]] = {}
    for name, items in by_queue.items():
        client = queues[name].client
        pipe, parts = by_client.setdefault(id(client), (client.pipeline(transaction=False), []))
        pipe.hmget(queues[name].keys.aborts, [m.id for m, _ in items])
        parts.append(items)
    found: list[tuple[Message, T, str]] = []
    for pipe, parts in by_client.values():
        with redis_errors("reading aborts"):
            replies = pipe.execute()
        for items, values in zip(parts, replies, strict=True):
            for (message, handler), value in zip(items, values, strict=True):
                parsed = parse_abort(value)
                if parsed is not None and parsed[0] == message.token:
                    found.append((message, handler, parsed[1]))
    return found


class AbortPoller:
    """A thread that learns the aborts of ``runs`` (see the module's docstring)."""

    def __init__(
        self,
        queues: Callable[[], Mapping[str, Queue]],
        runs: Runs,
        on_abort: Callable[[Run], None],
        poll_seconds: float = POLL_SECONDS,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        # The runs' clock unless told (an abort's grace is timed on the watchdog's).
        self._monotonic = monotonic or (lambda: runs.monotonic())
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
        """Read the aborts of the running handlers now; returns how many were new.

        A handler thread's message has no Run unless its queue has a time limit: an abort of
        it makes one (Runs.adopt), unless its handler has ended meanwhile."""
        running: list[tuple[Message, Run | Slot]] = [
            (r.message, r) for r in self._runs.all() if not r.aborted
        ]
        running += [(m, slot) for slot, m in self._runs.unwatched()]
        if not running:
            return 0
        try:
            found = read_aborts(self._queues(), running)
        except Exception as e:  # Redis down: the next poll tries again
            logger.debug("aborts not read: %s", e)
            return 0
        now = self._monotonic()
        new = 0
        for message, handler, reason in found:
            if isinstance(handler, Run):
                run: Run | None = handler
            else:  # timed from now: should a limit be set on its queue, its abort ends it first
                run = self._runs.adopt(handler, message, now)
            if run is None:  # its handler has ended: nothing left to stop
                continue
            if run.learn_abort(reason, now):
                new += 1
                logger.warning(
                    "queue %s: message %s aborted%s while its handler runs",
                    run.message.queue,
                    run.message.id,
                    f" ({reason})" if reason else "",
                    extra=message_fields(run.message),
                )
                self._on_abort(run)
        return new
