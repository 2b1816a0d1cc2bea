"""The busiest flow keys of a queue (ready + in flight), for queuestats, the admin and metrics.

Read by busiest_keys.lua in the stats' one round trip: exact and bounded whatever the number of
keys, since the engine keeps each key's load in the queue's ``key_load`` sorted set (one
``ZINCRBY`` where a keyed message enters its key's list or its delivery ends; see
lua/includes/key_turns.lua), so the top is one ``ZREVRANGE`` and a split per key shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core.envelope import to_str

TOP = 10  # keys shown


@dataclass(frozen=True)
class BusyKey:
    key: str
    ready: int  # in the key's list: waiting for its turn, slot or token
    in_flight: int

    @property
    def load(self) -> int:
        return self.ready + self.in_flight

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "ready": self.ready, "in_flight": self.in_flight}


@dataclass(frozen=True)
class BusiestKeys:
    """The busiest keys (at most :data:`TOP`, the busiest first) and what they were found
    among. ``keys_ready``: keys with ready messages; ``keys_with_messages``: keys with
    messages ready or in flight (every one of them ranked)."""

    keys: list[BusyKey] = field(default_factory=list)
    keys_ready: int = 0
    keys_with_messages: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "keys": [k.to_dict() for k in self.keys],
            "keys_with_ready_messages": self.keys_ready,
            "keys_with_messages": self.keys_with_messages,
        }

    def summary(self) -> str:
        """What they were ranked among: "of 12 key(s) with messages, 3 with ready ones"."""
        return (
            f"of {self.keys_with_messages:,} key(s) with messages, "
            f"{self.keys_ready:,} with ready ones"
        )


def read_busiest(raw: Any) -> BusiestKeys | None:
    """busiest_keys.lua's reply (None: unread or an error)."""
    if raw is None or isinstance(raw, Exception):
        return None
    ready, busy = int(raw[0]), int(raw[1])
    keys = [
        BusyKey(to_str(raw[i]), int(raw[i + 1]), int(raw[i + 2])) for i in range(2, len(raw), 3)
    ]
    return BusiestKeys(keys, ready, busy)


def merge_busiest(parts: Sequence[BusiestKeys | None]) -> BusiestKeys | None:
    """A sharded queue's: its shards' keys (a key lives on one shard) ranked together."""
    if any(p is None for p in parts):
        return None
    found = [p for p in parts if p is not None]
    keys = sorted((k for p in found for k in p.keys), key=lambda k: (-k.load, k.key))[:TOP]
    return BusiestKeys(
        keys,
        sum(p.keys_ready for p in found),
        sum(p.keys_with_messages for p in found),
    )
