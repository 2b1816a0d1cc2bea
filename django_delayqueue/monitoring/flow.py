"""What a queue's flow limits do now, for the stats (queuestats, the admin page, metrics).

Read by flow_state.lua from the queue's limiter hash (per shard: a sharded queue's stats add
its shards up): whether a limit holds the queue back and why, since when, how many messages
it throttled, and how many started in the last whole second (the current rate). With flow
keys, the keyed ready messages (counts.lua) wait their key's turn, slot or token: counted
apart (``waiting_on_keys``), and a claim that no key could give anything to is held by "key"
(counts.lua leaves those their key's limits hold out of the oldest overdue, not the others).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_delayqueue.core import QueueSettings
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.flow_limits import in_flight_problem, parse_rate, rate_problem


@dataclass(frozen=True)
class FlowStats:
    """A queue's flow limits and what they do. ``None``: not set, or could not be read."""

    rate_limit: str | None = None
    max_in_flight: int | None = None
    # Why the last claim took fewer than it could: "rate" or "in_flight" (None: nothing
    # waits on a limit), and how many ready messages wait on it, since when (ms).
    held: str | None = None
    waiting: int | None = None
    held_since_ms: int | None = None
    throttled: int | None = None  # messages that started later because of a limit, in all
    rate_now: float | None = None  # messages started in the last whole second
    key_concurrency: int | None = None
    key_rate_limit: str | None = None
    # Ready messages with a flow key, in their keys' lists: they wait for their key's turn,
    # slot or token (with key limits set: "key" is their reason), not for a consumer.
    waiting_on_keys: int | None = None

    @property
    def limited(self) -> bool:
        return self.rate_limit is not None or self.max_in_flight is not None or self.key_limited

    @property
    def key_limited(self) -> bool:
        return self.key_concurrency is not None or self.key_rate_limit is not None

    @property
    def rate_per_second(self) -> float | None:
        """The limit as messages per second (None: no rate limit)."""
        return None if self.rate_limit is None else parse_rate(self.rate_limit).per_second

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate_limit": self.rate_limit,
            "rate_limit_per_second": self.rate_per_second,
            "max_in_flight": self.max_in_flight,
            "rate_now": self.rate_now,
            "waiting_on_limit": self.waiting or 0,
            "held_by": self.held,
            "throttled": self.throttled,
            "key_concurrency": self.key_concurrency,
            "key_rate_limit": self.key_rate_limit,
            "waiting_on_keys": self.waiting_on_keys or 0,
        }

    def summary(self) -> str:
        """One short line: "20/s burst 5, 10 in flight; 18/s now; 240 wait (rate)"."""
        if not self.limited:
            return "—"
        parts = [p for p in (self.rate_limit, _cap(self.max_in_flight)) if p]
        if self.key_limited:
            per_key = [p for p in (self.key_rate_limit, _cap(self.key_concurrency)) if p]
            parts.append("per key " + " ".join(per_key))
        text = ", ".join(parts)
        if self.rate_now is not None:
            text += f"; {self.rate_now:g}/s now"
        if self.held:
            text += f"; {self.waiting or 0} wait ({self.held.replace('_', ' ')})"
        elif self.key_limited and self.waiting_on_keys:
            text += f"; {self.waiting_on_keys} wait (key)"
        return text


def _cap(value: int | None) -> str | None:
    return None if value is None else f"{value} in flight"


def read_flow(
    settings: QueueSettings,
    published: dict[str, str],
    raw: Any,
    ready: int | None,
    keyed: int | None = None,
) -> FlowStats:
    """The flow stats of one queue (or shard): its limits as published (the admin's) or in
    the settings file, and flow_state.lua's reply ``raw`` (None: unread); ``keyed``: how many
    of the ready messages have a flow key (counts.lua)."""
    rate, cap = settings.rate_limit, settings.max_in_flight
    key_cap, key_rate = settings.key_concurrency, settings.key_rate_limit
    if "rate_limit" in published or "max_in_flight" in published:
        rate = _published(published, "rate_limit", rate, rate_problem)
        cap = _published(published, "max_in_flight", cap, in_flight_problem)
    if "key_concurrency" in published or "key_rate_limit" in published:
        key_cap = _published(published, "key_concurrency", key_cap, in_flight_problem)
        key_rate = _published(published, "key_rate_limit", key_rate, rate_problem)
    keys: dict[str, Any] = {
        "key_concurrency": key_cap,
        "key_rate_limit": key_rate,
        "waiting_on_keys": keyed,
    }
    if raw is None:
        return FlowStats(rate, cap, **keys)
    held, since, throttled, last_second = raw
    held = to_str(held) or None
    if (
        (held == "rate" and rate is None)
        or (held == "in_flight" and cap is None)
        or (held == "key" and key_cap is None and key_rate is None)
    ):
        # A limit staff cleared since: claims without limits never touch the limiter, so
        # its flag stays behind; nothing waits on a limit that is not set.
        held = None
    return FlowStats(
        rate,
        cap,
        held=held,
        waiting=((keyed if held == "key" else ready) or 0) if held else 0,
        held_since_ms=int(since) if held and int(since) >= 0 else None,
        throttled=int(throttled),
        rate_now=float(last_second),
        **keys,
    )


def _published(published: dict[str, str], name: str, default: Any, problem: Any) -> Any:
    try:
        value = json.loads(published[name]) if name in published else default
    except ValueError:
        return default
    return default if problem(value) else value


def merge_flow(parts: Sequence[FlowStats]) -> FlowStats:
    """A sharded queue's flow stats: the limits (the queue's, not a share), its shards' counts
    added up, held when any shard is."""
    held = next((p.held for p in parts if p.held), None)
    since = [p.held_since_ms for p in parts if p.held_since_ms is not None]

    def total(values: list[Any]) -> Any:
        return None if any(v is None for v in values) else sum(values)

    return FlowStats(
        parts[0].rate_limit,
        parts[0].max_in_flight,
        held=held,
        waiting=total([p.waiting for p in parts]),
        held_since_ms=min(since) if since else None,
        throttled=total([p.throttled for p in parts]),
        rate_now=total([p.rate_now for p in parts]),
        key_concurrency=parts[0].key_concurrency,
        key_rate_limit=parts[0].key_rate_limit,
        waiting_on_keys=total([p.waiting_on_keys for p in parts]),
    )
