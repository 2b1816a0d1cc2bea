"""A queue's dead letters by reason: how many died of what, and the ids that died of one reason.

What staff look at before they requeue or purge: "40 died of 503 Service Unavailable during the
outage, 3 were rejected as invalid" calls for requeueing the first group only. Read by scripts
(dead_letter_reasons.lua, dead_letters_with_reason.lua) over the newest ``most`` dead letters
of each shard, so that a queue with millions of them costs a bounded read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.contracts import DEAD_LETTER_REASONS, DEAD_LETTERS_WITH_REASON

MOST_READ = 10_000  # the newest dead letters read per shard


class _Shard(Protocol):
    client: RedisClient
    keys: QueueKeys


class _Sharded(Protocol):
    @property
    def shards(self) -> Sequence[Any]: ...


@dataclass(frozen=True)
class ReasonGroup:
    reason: str  # '' for dead letters that were given none
    count: int
    newest_ms: int  # when the newest of them died


@dataclass(frozen=True)
class DeadLetterReasons:
    """The groups, largest first, over the ``read`` newest of ``total`` dead letters."""

    total: int
    read: int
    groups: list[ReasonGroup]

    @property
    def partial(self) -> bool:
        """Whether older dead letters were left out of the counts."""
        return self.read < self.total


def reasons_of(queue: _Sharded, most: int = MOST_READ) -> DeadLetterReasons:
    """``queue``'s dead letters by reason (a sharded queue's shards added up)."""
    if most < 1:
        raise ValueError(f"most must be at least 1, not {most!r}")
    total = read = 0
    counts: dict[str, int] = {}
    newest: dict[str, int] = {}
    for shard in queue.shards:
        raw = DEAD_LETTER_REASONS.call(shard.keys, most=most).run(shard.client)
        total += int(raw[0])
        read += int(raw[1])
        for i in range(2, len(raw) - 2, 3):
            reason, count, died = to_str(raw[i]), int(raw[i + 1]), int(float(raw[i + 2]))
            counts[reason] = counts.get(reason, 0) + count
            newest[reason] = max(died, newest.get(reason, died))
    groups = [ReasonGroup(r, counts[r], newest[r]) for r in counts]
    groups.sort(key=lambda g: (-g.count, -g.newest_ms, g.reason))
    return DeadLetterReasons(total, read, groups)


def ids_with_reason(queue: _Sharded, reason: str, most: int = MOST_READ) -> list[str]:
    """The ids of the newest ``most`` dead letters (per shard) that died of ``reason``."""
    if most < 1:
        raise ValueError(f"most must be at least 1, not {most!r}")
    ids: list[str] = []
    for shard in queue.shards:
        found = DEAD_LETTERS_WITH_REASON.call(shard.keys, most=most, reason=reason).run(
            shard.client
        )
        ids += [to_str(i) for i in found]
    return ids
