"""The busiest flow keys of a queue (ready + in flight), for queuestats, the admin and metrics.

Read by busiest_keys.lua in the stats' one round trip, bounded whatever the number of keys:
every key with messages in flight (the keys being worked on) and the next :data:`SAMPLE` keys
in turn and waiting for a token or a slot, one ``LLEN`` each. With more keys than that the top
is of that sample (``exact`` False), which the admin and queuestats say. An exact top over any
number of keys would need the engine to keep a sorted set of each key's count as messages come
and go (one ``ZINCRBY`` where a key's list or in-flight count changes): not kept today.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core.envelope import to_str

TOP = 10  # keys shown
SAMPLE = 100  # keys read from the head of the rotation, and of the keys waiting
MAX_STATE_FIELDS = 2000  # in-flight entries read (each message in flight has two)


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
    among. ``keys_ready``: keys with ready messages; ``keys_in_flight``: keys with messages in
    flight (None: more than could be read); ``exact``: every such key was looked at."""

    keys: list[BusyKey] = field(default_factory=list)
    keys_ready: int = 0
    keys_in_flight: int | None = 0
    exact: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "keys": [k.to_dict() for k in self.keys],
            "keys_with_ready_messages": self.keys_ready,
            "keys_in_flight": self.keys_in_flight,
            "exact": self.exact,
        }

    def summary(self) -> str:
        """How they were found: "of 12 keys" or "sampled among 100,000 keys"."""
        total = f"{self.keys_ready:,} key(s) with ready messages"
        return f"of {total}" if self.exact else f"a sample, among {total}"


def read_busiest(raw: Any) -> BusiestKeys | None:
    """busiest_keys.lua's reply (None: unread or an error)."""
    if raw is None or isinstance(raw, Exception):
        return None
    ready, flying, exact = int(raw[0]), int(raw[1]), bool(int(raw[2]))
    keys = [
        BusyKey(to_str(raw[i]), int(raw[i + 1]), int(raw[i + 2])) for i in range(3, len(raw), 3)
    ]
    return BusiestKeys(keys, ready, None if flying < 0 else flying, exact)


def merge_busiest(parts: Sequence[BusiestKeys | None]) -> BusiestKeys | None:
    """A sharded queue's: its shards' keys (a key lives on one shard) ranked together."""
    if any(p is None for p in parts):
        return None
    found = [p for p in parts if p is not None]
    keys = sorted((k for p in found for k in p.keys), key=lambda k: (-k.load, k.key))[:TOP]
    flying = [p.keys_in_flight for p in found]
    return BusiestKeys(
        keys,
        sum(p.keys_ready for p in found),
        None if any(f is None for f in flying) else sum(f or 0 for f in flying),
        all(p.exact for p in found),
    )
