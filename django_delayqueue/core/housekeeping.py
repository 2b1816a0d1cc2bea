"""What staff and request code do to waiting and dead messages: cancel, run now, requeue, purge.

A mixin of :class:`~django_delayqueue.core.queue.Queue` (which provides ``client``, ``keys``,
``clock`` and ``journal_maxlen``), kept apart from the producer's and the consumer's paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.calls import LuaScript, ScriptCall

if TYPE_CHECKING:
    from django_delayqueue.core.clock import Clock


class Housekeeping:
    client: RedisClient
    keys: QueueKeys
    clock: Clock
    journal_maxlen: int

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
        k = self.keys
        keys = [k.pending, k.retry, k.ready, k.messages, k.attempts, k.tokens, k.reasons]
        keys += (k.journal, k.unack, k.garbage, k.cancelled, k.ready_since, k.successors)
        args = [self.clock.now_ms(), max(0, self.journal_maxlen or 0), *ids]
        return ScriptCall(LuaScript.named("cancel"), keys, args).run(self.client)

    def run_now(self, *ids: str) -> int:
        """Move waiting messages (pending or retry) to ready, ahead of their due time."""
        if not ids:
            return 0
        k = self.keys
        return ScriptCall(
            LuaScript.named("run_now"),
            [k.pending, k.retry, k.ready, k.tokens, k.ready_since],
            [self.clock.now_ms(), k.wake_channel, *ids],
        ).run(self.client)

    def requeue(self, *ids: str, limit: int = 1000) -> int:
        """Dead letters back to ready with fresh attempts (all of them when no ids are given)."""
        k = self.keys
        script = LuaScript.named("requeue")
        keys = [k.garbage, k.ready, k.attempts, k.tokens, k.reasons, k.ready_since]
        if ids:
            args = [self.clock.now_ms(), limit, k.wake_channel, *ids]
            return int(ScriptCall(script, keys, args).run(self.client)[0])
        return sum(
            _drain(
                lambda: ScriptCall(script, keys, [self.clock.now_ms(), limit, k.wake_channel]).run(
                    self.client
                )
            )
        )

    def purge(self, *ids: str, limit: int = 1000) -> int:
        """Purge dead letters: deleted for good (all of them when no ids are given)."""
        k = self.keys
        script = LuaScript.named("purge")
        keys = [k.garbage, k.messages, k.attempts, k.tokens, k.reasons, k.successors]
        if ids:
            return int(ScriptCall(script, keys, [limit, *ids]).run(self.client)[0])
        return sum(_drain(lambda: ScriptCall(script, keys, [limit]).run(self.client)))


def _drain(call: Any) -> Iterator[int]:
    """Repeat a bounded script call until it reports nothing left (or no progress)."""
    while True:
        done, left = (int(x) for x in call())
        yield done
        if done == 0 or left == 0:
            return
