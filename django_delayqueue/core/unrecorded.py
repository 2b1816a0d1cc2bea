"""Outcomes of finished deliveries, waiting to be written to Redis with the next round trip.

The consumer does not acknowledge each message as its handler returns: the acks, nacks and one
journal entry of a whole batch ride on the pipeline of the next promote + claim, so recording
costs no round trip of its own. Outcomes stay here until a flush succeeds, so an outage or a
failing script loses none of them (they are tried again with the next round).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from .outcome import ACK, GARBAGE, Outcome, journal_entry
from .queue import Queue
from .scripts import LuaScript, ScriptBatch

logger = logging.getLogger(__name__)

# One flushed call and the outcomes whose per-message result codes it returns (a nack's);
# acks and journal entries return nothing per message worth reading.
Flush = list[tuple[Queue, list[Outcome]]]


class UnrecordedOutcomes:
    """What finished deliveries did, until Redis has it (acks, nacks, the journal)."""

    def __init__(self, queues: Sequence[Queue], journal_maxlen: int) -> None:
        self._by_name = {q.name: q for q in queues}
        self.journal_maxlen = journal_maxlen
        self._outcomes: list[Outcome] = []

    def __len__(self) -> int:
        return len(self._outcomes)

    def extend(self, outcomes: Iterable[Outcome]) -> None:
        self._outcomes.extend(outcomes)

    def add_to(self, batch: ScriptBatch, now: int) -> Flush:
        """Queue the acks, nacks and journal entry of every outcome on ``batch``."""
        flush: Flush = []
        grouped: dict[str, list[Outcome]] = {}
        for outcome in self._outcomes:
            grouped.setdefault(outcome.message.queue, []).append(outcome)
        for name, outcomes in grouped.items():
            q = self._by_name[name]
            acks = [o.message for o in outcomes if o.status == ACK]
            retry = [o for o in outcomes if o.status not in (ACK, GARBAGE)]
            bury = [o for o in outcomes if o.status == GARBAGE]
            if acks:
                batch.add(*q.ack_call(acks))
                flush.append((q, []))
            if retry:
                batch.add(*q.nack_call([(o.message, o.delay, o.reason) for o in retry], now))
                flush.append((q, retry))
            if bury:
                nacks = [(o.message, None, o.reason) for o in bury]
                batch.add(*q.nack_call(nacks, now, bury=True))
                flush.append((q, bury))
            if self.journal_maxlen:
                batch.add(*self._journal_call(q, outcomes))
                flush.append((q, []))
        return flush

    def settle(self, flush: Flush, results: Sequence[Any]) -> None:
        """Forget the flushed outcomes; keep them all when a call failed, to try again."""
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            logger.error("could not record %d outcome(s): %s", len(self), failed[0])
            return
        for (q, outcomes), result in zip(flush, results, strict=False):
            if outcomes and isinstance(result, list):
                for outcome, code in zip(outcomes, result, strict=False):
                    if int(code) == 2 and outcome.status != GARBAGE:
                        logger.warning(
                            "queue %s: message %s used its last attempt: %s",
                            q.name,
                            outcome.message.id,
                            outcome.reason,
                        )
        self._outcomes = []

    def _journal_call(self, q: Queue, outcomes: list[Outcome]) -> tuple[Any, list, list]:
        fields = [item for pair in journal_entry(outcomes).items() for item in pair]
        return LuaScript.named("journal"), [q.keys.journal], [self.journal_maxlen, *fields]
