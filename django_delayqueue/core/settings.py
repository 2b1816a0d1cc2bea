"""Per-queue settings the engine needs (the Django layer fills them from ``DELAYQUEUE``)."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from django_delayqueue.core.envelope import DEFAULT_MAX_PAYLOAD_BYTES
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.flow_limits import (
    claim_spec,
    in_flight_problem,
    key_claim_spec,
    rate_problem,
)

# The settings that may be None (no limit): a number of seconds otherwise.
LIMIT_FIELDS: tuple[str, ...] = ("soft_time_limit", "time_limit")
MAX_LIMIT_SECONDS = 7 * 24 * 3600
TIME_LIMIT_ORDER = "time_limit must be greater than soft_time_limit"
# How long past its time_limit a handler may still run in a consumer that cannot renew its
# lease (cut off from Redis): the watchdog's wait for the stopped handler to end, rounded up.
LIMIT_MARGIN_SECONDS = 2.0


@dataclass(frozen=True)
class QueueSettings:
    max_attempts: int = 5
    backoff_base: float = 1.0  # seconds before the first retry
    backoff_max: float = 3600.0  # cap on the exponential backoff, seconds
    visibility_timeout: float = 60.0  # seconds a claimed message stays invisible
    claim_batch: int = 100  # messages claimed per round trip
    concurrency: int = 1  # handler threads per queue in each consumer
    paused: bool = False
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    promote_batch: int = 1000  # bound on ids moved per promote/reap call
    # Handler time limits, seconds (None: unlimited). At the soft limit the handler gets
    # dq.SoftTimeLimitExceeded raised in it; at the hard limit it is stopped, whatever it is
    # blocked in (its process is replaced when its thread cannot be), and its message retried.
    soft_time_limit: float | None = None
    time_limit: float | None = None
    # After dq.abort(), how long a running handler gets to stop by itself before it is stopped.
    abort_grace_seconds: float = 10.0
    # Flow control across every consumer (core/flow_limits.py, decided in the claim):
    # "20/s", "1200/m", "100/h", optionally "20/s burst 5"; and a cap on the queue's
    # messages in flight. None: no limit (the claim then pays nothing for them).
    rate_limit: str | None = None
    max_in_flight: int | None = None
    # The admin, queuestats and (opted in) the health probe flag the queue when the p99 of its
    # handlers' start lateness over the last 5 minutes passes this many ms (None: never).
    lateness_warning_ms: float | None = None
    # Per flow key (schedule(..., key=...)): at most this many of a key's messages in flight,
    # and a rate per key (the syntax of rate_limit). None: no limit.
    key_concurrency: int | None = None
    key_rate_limit: str | None = None

    def __post_init__(self) -> None:
        for problem in self.problems():
            raise ConfigurationError(problem)

    def problems(self) -> list[str]:
        # Seconds that are NaN or infinite: every comparison with NaN is false, so the ranges
        # below would let it by (the time limits' own in limit_problems).
        seconds = ("backoff_base", "backoff_max", "visibility_timeout")
        out = [p for name in seconds if (p := not_finite(name, getattr(self, name)))]
        if self.max_attempts < 1:
            out.append("max_attempts must be at least 1")
        base, most = self.backoff_base, self.backoff_max
        if not nan_or_infinite(base) and (base < 0 or most < base):
            out.append("backoff_base must be >= 0 and backoff_max >= backoff_base")
        if self.visibility_timeout < 1:
            out.append("visibility_timeout must be at least 1 second")
        if not 1 <= self.claim_batch <= 10_000:
            out.append("claim_batch must be between 1 and 10000")
        if not 1 <= self.concurrency <= 1024:
            out.append("concurrency must be between 1 and 1024")
        if not 1 <= self.max_payload_bytes <= 64 * 1024 * 1024:
            out.append("max_payload_bytes must be between 1 and 64 MiB")
        if not 1 <= self.promote_batch <= 100_000:
            out.append("promote_batch must be between 1 and 100000")
        if problem := lateness_warning_problem(self.lateness_warning_ms):
            out.append(problem)
        for problem in (
            rate_problem(self.rate_limit),
            in_flight_problem(self.max_in_flight),
            rate_problem(self.key_rate_limit, "key_rate_limit"),
            in_flight_problem(self.key_concurrency, "key_concurrency"),
        ):
            if problem:
                out.append(problem)
        return out + self.limit_problems()

    @property
    def flow_limited(self) -> bool:
        """Whether a rate limit or an in-flight cap applies to the claims."""
        return self.rate_limit is not None or self.max_in_flight is not None

    @property
    def key_limited(self) -> bool:
        """Whether a flow key's in-flight cap or rate applies to the claims."""
        return self.key_concurrency is not None or self.key_rate_limit is not None

    def claim_limits(self, shard: int | None = None, shards: int = 1) -> str:
        """claim.lua's ``limits`` argument for ``shard`` of ``shards`` (see flow_limits)."""
        spec = claim_spec(self.rate_limit, self.max_in_flight, shard, shards)
        if not self.key_limited:
            return spec
        return f"{spec or '0 0 0'} {key_claim_spec(self.key_concurrency, self.key_rate_limit)}"

    def limit_problems(self) -> list[str]:
        """The time limits' own problems (the system checks give the order its own id)."""
        names = (*LIMIT_FIELDS, "abort_grace_seconds")
        out = [p for name in names if (p := not_finite(name, getattr(self, name)))]
        if out:  # NaN compares false: the ranges below would say it less plainly
            return out
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if value is not None and not 0 < value <= MAX_LIMIT_SECONDS:
                out.append(f"{name} must be more than 0 and at most {MAX_LIMIT_SECONDS} seconds")
        if not 0 <= self.abort_grace_seconds <= MAX_LIMIT_SECONDS:
            out.append(f"abort_grace_seconds must be between 0 and {MAX_LIMIT_SECONDS}")
        soft, hard = self.soft_time_limit, self.time_limit
        if not out and soft is not None and hard is not None and hard <= soft:
            out.append(TIME_LIMIT_ORDER)
        return out

    def uncovered_limit(self) -> bool:
        """Whether the visibility timeout cannot cover ``time_limit``: a message whose lease
        was never renewed after its claim could be delivered again while its handler still
        runs (see docs/workers.md, "Time limits")."""
        limit = self.time_limit
        return limit is not None and self.visibility_timeout < limit + LIMIT_MARGIN_SECONDS

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retrying after failed ``attempt`` (1-based), with jitter.

        Full exponential backoff, then a random 50-100% of it so that messages that failed
        together do not all come back together.
        """
        delay = min(self.backoff_max, self.backoff_base * (2 ** max(0, attempt - 1)))
        return delay * (0.5 + random.random() / 2)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> QueueSettings:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ConfigurationError(f"unknown queue settings: {', '.join(sorted(unknown))}")
        return cls(**data)

    def to_mapping(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> QueueSettings:
        return replace(self, **changes)


MAX_LATENESS_WARNING_MS = 3_600_000


def nan_or_infinite(value: Any) -> bool:
    """Whether ``value`` is a float that is NaN or infinite (an int never is, however large)."""
    return isinstance(value, float) and not math.isfinite(value)


def not_finite(name: str, value: Any, unit: str = "seconds") -> str | None:
    """The problem of a number that is NaN or infinite (``name`` must be a finite number of
    ``unit``), or None: for any other value, whose type and range are checked apart."""
    if nan_or_infinite(value):
        return f"{name} must be a finite number of {unit}, not {value!r}"
    return None


def lateness_warning_problem(value: Any) -> str | None:
    """What is wrong with a ``lateness_warning_ms`` value, or None (None: no warning)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"lateness_warning_ms must be a number of milliseconds or None, not {value!r}"
    if problem := not_finite("lateness_warning_ms", value, "milliseconds"):
        return problem
    if not 0 < value <= MAX_LATENESS_WARNING_MS:
        return (
            f"lateness_warning_ms must be more than 0 and at most {MAX_LATENESS_WARNING_MS} "
            "(an hour)"
        )
    return None
