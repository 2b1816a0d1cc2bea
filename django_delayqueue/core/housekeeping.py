"""What staff and request code do to waiting and dead messages (cancel, run now, requeue, purge)
and to running ones (abort).

A part of :class:`~django_delayqueue.core.queue.Queue`, given the queue's
:class:`~.queue_place.QueuePlace` and the length its journal is capped at; kept apart from the
producer's and the consumer's paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.envelope import storable_text, to_str
from django_delayqueue.core.results import AbortResult
from django_delayqueue.core.scripts.calls import ScriptCall, redis_errors
from django_delayqueue.core.scripts.contracts import ABORT, CANCEL, PURGE, REQUEUE, RUN_NOW

if TYPE_CHECKING:
    from django_delayqueue.core.queue_place import QueuePlace

# How long the result record of a task cancelled or purged here is kept when it has no expiry
# yet (the Tasks backend's default RESULT_TTL): long enough for its caller to read FAILED, and
# not for ever. A record that has one (its task ended) keeps it: the backend's RESULT_TTL.
ENDED_RECORD_TTL_SECONDS = 7 * 24 * 3600


class Housekeeping:
    """Staff's and request code's changes to one queue's waiting, dead and running messages."""

    def __init__(self, place: QueuePlace, journal_maxlen: int) -> None:
        self.place = place
        self.journal_maxlen = journal_maxlen  # cap of the journal stream cancels write to

    def cancel(self, *ids: str) -> int:
        """Remove waiting messages (pending, retry or ready); returns how many were removed.

        In-flight (unack) and dead (garbage) messages are left alone, but a successor booked
        under an id (``schedule(..., replace=True)`` while it was in flight) is removed and
        counted, so an id may count two. Each id costs O(log n) whatever the queue holds: a
        ready message's entry stays in the list, dead (see :attr:`QueueKeys.cancelled`), unless
        it is at one end. The cancelled ones are recorded in the journal (outcome ``cancel``).
        """
        if not ids:
            return 0
        call = CANCEL.call(
            self.place.keys,
            records=[self.place.keys.task_result(i) for i in ids],
            now_ms=self.place.clock.now_ms(),
            journal_max_length=max(0, self.journal_maxlen or 0),
            record_kept_seconds=ENDED_RECORD_TTL_SECONDS,
            ids=ids,
        )
        return call.run(self.place.client)

    def abort(self, message_id: str, reason: str = "") -> AbortResult:
        """Ask the handler running ``message_id`` to stop; its message goes to the dead letters
        with the reason "aborted: <reason>" (see docs/workers.md). Only an in-flight message
        is aborted: the result is falsy, and nothing changes, for any other."""
        call = ABORT.call(
            self.place.keys,
            wake_channel=self.place.keys.wake_channel,
            id=message_id,
            reason=storable_text(reason, 1000),
        )
        return AbortResult(self.place.name, message_id, to_str(call.run(self.place.client) or ""))

    def run_now(self, *ids: str) -> int:
        """Move waiting messages (pending or retry) to ready, ahead of their due time."""
        if not ids:
            return 0
        call = RUN_NOW.call(
            self.place.keys,
            now_ms=self.place.clock.now_ms(),
            wake_channel=self.place.keys.wake_channel,
            ids=ids,
        )
        return call.run(self.place.client)

    def requeue(self, *ids: str, limit: int = 1000) -> int:
        """Dead letters back to ready with fresh attempts (all of them when no ids are given).

        A requeued task's result record loses its expiry: it is unfinished again.
        """
        if ids:
            return int(self._requeue_call(ids).run(self.place.client)[0])
        return sum(_drain(lambda: self._each_oldest("requeue", limit, self._requeue_call)))

    def _requeue_call(self, ids: Sequence[str]) -> ScriptCall:
        return REQUEUE.call(
            self.place.keys,
            records=[self.place.keys.task_result(i) for i in ids],
            now_ms=self.place.clock.now_ms(),
            wake_channel=self.place.keys.wake_channel,
            ids=ids,
        )

    def purge(self, *ids: str, limit: int = 1000) -> int:
        """Purge dead letters: deleted for good (all of them when no ids are given).

        A purged task's result record keeps the expiry it has (its FAILED end's), or is kept
        ``ENDED_RECORD_TTL_SECONDS`` more when it has none (a task buried by a reap or a claim).
        """
        if ids:
            return int(self._purge_call(ids).run(self.place.client)[0])
        return sum(_drain(lambda: self._each_oldest("purge", limit, self._purge_call)))

    def _each_oldest(
        self, action: str, limit: int, call: Callable[[Sequence[str]], ScriptCall]
    ) -> list[int]:
        """``call`` run on the oldest ``limit`` dead letters: one bounded step of a drain.

        Listed first, because the script takes each id's result record through KEYS; an id
        that leaves the dead letters meanwhile is skipped by the script.
        """
        with redis_errors(action):
            found = self.place.client.zrange(self.place.keys.garbage, 0, limit - 1)
        chosen = [to_str(i) for i in found if isinstance(i, (bytes, str))]
        return call(chosen).run(self.place.client) if chosen else [0, 0]

    def _purge_call(self, ids: Sequence[str]) -> ScriptCall:
        return PURGE.call(
            self.place.keys,
            records=[self.place.keys.task_result(i) for i in ids],
            record_kept_seconds=ENDED_RECORD_TTL_SECONDS,
            ids=ids,
        )


def _drain(call: Any) -> Iterator[int]:
    """Repeat a bounded script call until it reports nothing left (or no progress)."""
    while True:
        done, left = (int(x) for x in call())
        yield done
        if done == 0 or left == 0:
            return
