"""Claims whose reply was lost: asked for again by their claim id, so their messages arrive.

A claim runs in Redis and its reply can be lost on the way back: the connection breaks after
Redis ran the script (redis-py may then send the whole pipeline again by itself). Its messages
would sit in unack until their visibility timeout, which uses up an attempt (and dead-letters
them on their last one) though they never started. So every claim of a consumer carries a
claim id and the receipt key of that consumer instance, where claim.lua records what the claim
took; a claim whose reply did not arrive is sent again with the same id and returns those same
messages instead of new ones. Costs the claim a GET, and a SET when it takes something.
"""

from __future__ import annotations

import uuid

from django_delayqueue.core.envelope import ENVELOPE_FORMAT
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import ScriptCall


class ClaimReceipts:
    """The claim ids of one consumer instance, and which queues' last claim went unanswered."""

    def __init__(self, reads_format: int = ENVELOPE_FORMAT) -> None:
        # The newest envelope format the consumer reads, said with each claim (claim.lua).
        self.reads_format = reads_format
        # Names the receipt key: two consumers given the same name never share one.
        self.consumer = uuid.uuid4().hex[:16]
        self._serial = 0
        self._sent: dict[str, str] = {}  # queue name -> claim id sent, reply not read yet
        self._unseen: dict[str, str] = {}  # queue name -> claim id whose reply was lost

    def call(self, q: Queue, now_ms: int, count: int, *, replay_only: bool = False) -> ScriptCall:
        """The claim of ``count`` messages of ``q``; if its last claim went unanswered, the
        same claim again (its messages, nothing new). ``replay_only``: nothing new in any case
        (the consumer is stopping, or has no room)."""
        claim_id = self._unseen.get(q.name)
        if claim_id is None:
            self._serial += 1
            claim_id = str(self._serial)
        self._sent[q.name] = claim_id
        receipt = q.keys.claim_receipt(self.consumer)
        return q.claim_call(
            now_ms,
            count,
            receipt=receipt,
            claim_id=claim_id,
            replay_only=replay_only,
            reads_format=self.reads_format,
        )

    def unseen(self, name: str) -> bool:
        """Whether queue ``name``'s last claim may have run without its reply arriving."""
        return name in self._unseen

    def answered(self, name: str) -> None:
        """Queue ``name``'s claim got its reply (messages, or a script error: that claim
        changed nothing, see claim.lua): a new claim id next time."""
        self._sent.pop(name, None)
        self._unseen.pop(name, None)

    def lost(self, names: list[str]) -> None:
        """The round trip carrying the claims of queues ``names`` failed: whatever they took
        is asked for again, by the same claim ids."""
        for name in names:
            claim_id = self._sent.pop(name, None)
            if claim_id is not None:
                self._unseen[name] = claim_id
