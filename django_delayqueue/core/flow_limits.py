"""Flow control of a queue: its ``rate_limit`` and ``max_in_flight``, as the claim applies them.

Both are queue settings (``QUEUES[name]["rate_limit"] = "20/s burst 5"``,
``["max_in_flight"] = 10``) and are decided inside claim.lua (``includes/flow_limits.lua``),
so any number of consumers share them exactly: a claim takes at most what the limits allow at
that instant, atomically, and tells the consumer when the next message may start.

The rate is a GCRA (a token bucket kept as one "theoretical arrival time" per queue): messages
start at most ``count`` per ``period``, evenly spaced, with at most ``burst`` at once after a
quiet time (default 1: evenly spaced from the first message on).

A sharded queue's shards are separate hash tags (on a cluster, separate slots: a claim script
can touch no key of another shard), so each shard's claim keeps a share of the limits: the
rate divided by the number of shards, the burst and the in-flight cap split between them (the
remainder to the first shards). The in-flight shares never add up to more than the cap; a
shard with nothing waiting leaves its share unused (ids spread evenly over the shards, so a
backlog does too). Each shard's bucket holds at least one token, so after a lull every shard
may start one message at the same instant: a sharded queue's effective burst is at least its
number of shards (its shards are separate scripts, they cannot take turns). This is what
:func:`claim_spec` hands the claim, and why the checks and the admin form refuse a
``max_in_flight`` (or a burst above 1) smaller than the number of shards. A cap smaller than
that which reaches a consumer anyway (published to Redis by hand) is clamped: the first shards
get one slot each, the others none (they claim nothing while it stays set), with a warning.

A flow key (``dq.schedule(..., key=...)``) has limits of its own, ``key_concurrency`` and
``key_rate_limit`` (:func:`key_claim_spec`): the spec string carries them after the queue's,
and lua/includes/key_claims.lua applies them to each key whose turn it is. They are never split
between shards: every message of a key lives on the key's shard.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from functools import lru_cache

from django_delayqueue.core.errors import ConfigurationError

PERIOD_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
_UNITS = {
    "s": "s",
    "sec": "s",
    "second": "s",
    "m": "m",
    "min": "m",
    "minute": "m",
    "h": "h",
    "hour": "h",
}
_RATE_RE = re.compile(
    r"^\s*(?P<count>\d+)\s*/\s*(?P<unit>[a-z]+)\s*(?:burst\s+(?P<burst>\d+)\s*)?$",
    re.IGNORECASE,
)
MAX_RATE_COUNT = 1_000_000  # per period: more would be a limit nobody needs
MAX_BURST = 100_000
MAX_IN_FLIGHT = 1_000_000
# claim.lua's cap for a shard whose share of max_in_flight is none (0 means "no cap").
NO_SLOT_SHARE = -1

logger = logging.getLogger(__name__)
RATE_FORMAT = '"<count>/<s|m|h>" with an optional " burst <n>", e.g. "20/s" or "20/s burst 5"'


@dataclass(frozen=True)
class RateLimit:
    """``count`` messages per ``period_ms``, at most ``burst`` started at once."""

    count: int
    period_ms: int
    burst: int = 1

    @property
    def interval_ms(self) -> float:
        """The time between two starts at the full rate (the GCRA's emission interval)."""
        return self.period_ms / self.count

    @property
    def per_second(self) -> float:
        return self.count * 1000 / self.period_ms

    def __str__(self) -> str:
        unit = {v: k for k, v in PERIOD_MS.items()}[self.period_ms]
        return f"{self.count}/{unit}" + (f" burst {self.burst}" if self.burst != 1 else "")


def parse_rate(value: object) -> RateLimit:
    """``"20/s"``, ``"1200/m"``, ``"100/h"``, ``"20/s burst 5"`` as a :class:`RateLimit`."""
    match = _RATE_RE.match(value) if isinstance(value, str) else None
    unit = _UNITS.get(match.group("unit").lower()) if match else None
    if match is None or unit is None:
        raise ConfigurationError(f"rate_limit must be {RATE_FORMAT}, not {value!r}")
    count = int(match.group("count"))
    burst = int(match.group("burst") or 1)
    if not 1 <= count <= MAX_RATE_COUNT:
        raise ConfigurationError(f"rate_limit's count must be 1 to {MAX_RATE_COUNT}, not {count}")
    if not 1 <= burst <= MAX_BURST:
        raise ConfigurationError(f"rate_limit's burst must be 1 to {MAX_BURST}, not {burst}")
    return RateLimit(count, PERIOD_MS[unit], burst)


def rate_problem(value: object, name: str = "rate_limit") -> str | None:
    """What is wrong with a ``rate_limit`` (or ``key_rate_limit``: ``name``) value (None is no
    limit), or None."""
    if value is None:
        return None
    try:
        parse_rate(value)
    except ConfigurationError as e:
        return str(e).replace("rate_limit", name)
    return None


def in_flight_problem(value: object, name: str = "max_in_flight") -> str | None:
    """What is wrong with a ``max_in_flight`` (or ``key_concurrency``: ``name``) value (None is
    no cap), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_IN_FLIGHT:
        return f"{name} must be a whole number from 1 to {MAX_IN_FLIGHT} (or None)"
    return None


@lru_cache(maxsize=4096)
def key_claim_spec(key_concurrency: int | None, key_rate_limit: str | None) -> str:
    """The flow keys' part of claim.lua's ``limits``: ``"<key cap> <key interval ms> <key
    burst>"`` (0: off), read by lua/includes/key_claims.lua.

    Not split between shards: every message of a key lives on one shard (the key's, see
    ``ShardedQueue.id_for_key``), so that shard keeps the key's whole limits, exactly.
    """
    interval, burst = 0.0, 1
    if key_rate_limit is not None:
        rate = parse_rate(key_rate_limit)
        interval, burst = rate.interval_ms, rate.burst
    return f"{key_concurrency or 0} {_number(interval)} {burst}"


def shards_problem(rate_limit: str | None, max_in_flight: int | None, shards: int) -> str | None:
    """A sharded queue whose limits cannot be split between its shards (see the module)."""
    if shards <= 1:
        return None
    if max_in_flight is not None and max_in_flight < shards:
        return (
            f"max_in_flight ({max_in_flight}) must be at least the number of shards ({shards}):"
            " each shard's claims keep a share of it"
        )
    if rate_limit is not None and rate_problem(rate_limit) is None:
        burst = parse_rate(rate_limit).burst
        if 1 < burst < shards:
            return (
                f"rate_limit's burst ({burst}) must be 1 or at least the number of shards "
                f"({shards}): each shard's claims keep a share of it"
            )
    return None


def _share(total: int, shards: int, index: int) -> int:
    """Shard ``index``'s part of ``total`` split between ``shards`` (remainder first)."""
    return total // shards + (1 if index < total % shards else 0)


@lru_cache(maxsize=4096)  # per claim of a limited queue: parsed once per value
def claim_spec(
    rate_limit: str | None, max_in_flight: int | None, shard: int | None, shards: int
) -> str:
    """What claim.lua's ``limits`` argument says for one shard (or the whole queue): ``""``
    without limits (the claim then pays one comparison), else ``"<interval ms> <burst>
    <cap>"`` (0: that limit is off; :data:`NO_SLOT_SHARE`: no slot for this shard)."""
    if rate_limit is None and max_in_flight is None:
        return ""
    index = shard or 0
    interval, burst = 0.0, 0
    if rate_limit is not None:
        rate = parse_rate(rate_limit)
        interval = rate.interval_ms * shards
        # A bucket of 0 would never start anything: every shard keeps one token at least
        # (the module: the effective burst of a sharded queue is at least its shards).
        burst = max(1, _share(rate.burst, shards, index))
    cap = 0
    if max_in_flight is not None:
        cap = _share(max_in_flight, shards, index) or NO_SLOT_SHARE
        if max_in_flight < shards and index == 0:  # warned once per value (lru_cache)
            logger.warning(
                "max_in_flight %s is smaller than the queue's %s shards: shards %s to %s get "
                "no slot and claim nothing while it is set (the checks and the admin refuse "
                "this value; raise it or use fewer shards)",
                max_in_flight,
                shards,
                max_in_flight,
                shards - 1,
            )
    return f"{_number(interval)} {burst} {cap}"


def _number(ms: float) -> str:
    """A Lua-readable number, exact enough for sub-millisecond intervals."""
    return "0" if ms == 0 else f"{ms:.6f}".rstrip("0").rstrip(".") if math.isfinite(ms) else "0"
