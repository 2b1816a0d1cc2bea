"""Progress reported by running handlers, kept in memory until their consumer sends it.

``message.progress(percent, note)`` and ``dq.progress(percent, note)`` (a task's too) cost no
Redis call: they keep the latest report of the delivery in :data:`REPORTS`, replacing the one
before, and the consumer's extender thread sends what is waiting on each of its ticks
(:func:`send_reports`, every ``extender.TICK_SECONDS``): one ``progress.lua`` call per queue
that has reports, carrying the latest of each of its running messages. So a handler reporting
in a tight loop costs Redis at most one call per queue per tick, a report is visible within
about a tick (plus a round trip), and a consumer whose handlers never report makes no call at
all (a look at an empty dict per tick). ``progress.lua`` writes a report only for the delivery
holding the message's current token while it is in flight: one sent after its handler ended
(acked, retried, reaped and redelivered) is dropped there.

Which delivery reports is found as ``dq.abort_requested()`` finds it (see :mod:`.limits.runs`): the
handler thread's slot, a coroutine's (or a task's) Run, or the slot of the handler thread whose
context this one was copied from (``async_to_sync``, ``copy_context().run``); and for
``message.progress`` called on another thread, the consumer's handler running that message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_delayqueue.core.consumer.limits.handler_run import _same_delivery
from django_delayqueue.core.consumer.limits.runs import Slot, _current, _here, _registries
from django_delayqueue.core.consumer.limits.shared_slot import shared_slot
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.progress import checked_progress
from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)

WARN_EVERY_SECONDS = 60.0  # a server that refuses reports (full, down) is logged this often
_warned_at: dict[str, float] = {}

# A report waiting to be sent: (token, percent, note), by message id, by physical queue name.
Waiting = dict[str, dict[str, tuple[str, float, str]]]


class ProgressReports:
    """The reports of this process's running deliveries not sent yet (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: Waiting = {}

    def put(self, delivery: Message, percent: float, note: str) -> None:
        with self._lock:
            self._waiting.setdefault(delivery.queue, {})[delivery.id] = (
                delivery.token,
                percent,
                note,
            )

    def take(self, queue: str) -> list[tuple[str, str, float, str]]:
        """The reports waiting for ``queue`` (a physical queue's name), as (id, token, percent,
        note), taken: each is sent once, and a newer report of the same message replaces it."""
        if queue not in self._waiting:  # the usual case, read without the lock
            return []
        with self._lock:
            waiting = self._waiting.pop(queue, {})
        return [(i, token, p, note) for i, (token, p, note) in waiting.items()]

    def __bool__(self) -> bool:
        return bool(self._waiting)


REPORTS = ProgressReports()


def report_progress(percent: Any, note: Any = "", message: Message | None = None) -> bool:
    """Record the progress of the delivery running here (of ``message``, if given: found on any
    of this process's handlers); sent with its consumer's next tick. ``percent`` 0 to 100 and
    ``note`` a str, else ValueError (see core/progress.py). Returns False, sending nothing,
    when no such delivery runs in this process (code run outside a handler, a task called
    directly, a handler that has ended)."""
    value, text = checked_progress(percent, note)
    delivery = _delivery_here(message)
    if delivery is None and message is not None:
        delivery = _delivery_anywhere(message)
    if delivery is None:
        return False
    REPORTS.put(delivery, value, text)
    return True


def progress(percent: float, note: str = "") -> bool:
    """``dq.progress``: report how far the handler (or task) running here got, ``percent``
    from 0 to 100 and a short ``note``; what ``message.progress`` does, for code that has no
    message at hand (a ``@task``, a function the handler calls). False outside a handler."""
    return report_progress(percent, note)


def _delivery_here(message: Message | None) -> Message | None:
    """The delivery whose handler runs here (as its consumer claimed it: on its physical
    queue), if it is ``message`` (any, without one)."""
    run = _current.get()  # a coroutine's, or a thread's started with Runs.begin
    if run is not None:
        found, logical = run.message, run.logical_queue
    else:
        slot = _here.slot
        if slot is None or not slot.inside:
            slot = _copied_slot()
        if slot is None or slot.message is None or not slot.inside:
            return None
        found, logical = slot.message, slot.logical_queue
    if message is not None and not _same_delivery(found, logical, message):
        return None
    return found


def _copied_slot() -> Slot | None:
    """The slot of the handler thread this context was copied from, if it still runs the
    message it ran when this copy was first read (see .shared_slot)."""
    shared = shared_slot.get()
    if shared is None:
        return None
    slot = shared.slot
    slot.shared = True  # its thread puts a new SharedSlot in its context before its next message
    if shared.message is None:
        shared.message = slot.message
    return slot if shared.message is slot.message else None


def _delivery_anywhere(message: Message) -> Message | None:
    """The delivery ``message`` as one of this process's consumers runs it (``message.progress``
    called on a thread of the user's)."""
    for runs in list(_registries):
        for run in runs.all():
            if run.matches(message):
                return run.message
        for slot, running in runs.unwatched():
            if slot.runs_message(message):
                return running
    return None


def send_reports(
    queues: Sequence[Queue], in_flight: Callable[[str], Sequence[Message]] | None = None
) -> int:
    """Send the reports waiting for ``queues`` (one call per queue that has some); returns how
    many were written. With ``in_flight`` (queue name -> the deliveries its consumer holds),
    the reports of deliveries that have ended since are dropped here rather than by
    progress.lua. A queue whose call fails loses its reports (the next ones replace them) and
    never keeps another's from being sent."""
    if not REPORTS:
        return 0
    written = 0
    for q in queues:
        reports = REPORTS.take(q.name)
        if reports and in_flight is not None:
            held = {m.token for m in in_flight(q.name)}
            reports = [r for r in reports if r[1] in held]
        if not reports:
            continue
        try:
            written += q.write_progress(reports)
        except Exception as e:  # Redis down, out of memory: a newer report comes with a later tick
            now = time.monotonic()
            if now - _warned_at.get(q.name, -WARN_EVERY_SECONDS) >= WARN_EVERY_SECONDS:
                _warned_at[q.name] = now
                logger.warning("queue %s: progress reports not sent: %s", q.name, e)
    return written
