"""E015: a queue's flow limits (``rate_limit``, ``max_in_flight``, ``key_concurrency``,
``key_rate_limit``): a value that cannot be read, or one that cannot be split between the
queue's shards (core/flow_limits.py). A key's limits are never split: a key lives on one
shard."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error

from django_delayqueue.core.flow_limits import (
    MAX_IN_FLIGHT,
    RATE_FORMAT,
    in_flight_problem,
    rate_problem,
    shards_problem,
)

FLOW_SETTINGS = ("rate_limit", "max_in_flight", "key_concurrency", "key_rate_limit")

_RATE_HINT = (
    f"Write rate_limit as {RATE_FORMAT}: at most <count> messages of the queue start per "
    "second, minute or hour across every consumer, at most <n> at once after a quiet time "
    "(default 1: evenly spaced). None (or leaving it out) sets no limit. See docs/flow-control.md."
)
_IN_FLIGHT_HINT = (
    f"max_in_flight is how many messages of the queue may run at once across every consumer: "
    f"a whole number from 1 to {MAX_IN_FLIGHT}, or None for no cap. See docs/flow-control.md."
)
_KEY_RATE_HINT = (
    f"Write key_rate_limit as {RATE_FORMAT}: at most <count> messages of one flow key start "
    "per second, minute or hour across every consumer, at most <n> at once after a quiet time. "
    "None (or leaving it out) sets no limit. See docs/flow-control.md, 'Keys'."
)
_KEY_CONCURRENCY_HINT = (
    f"key_concurrency is how many messages of one flow key may run at once across every "
    f"consumer: a whole number from 1 to {MAX_IN_FLIGHT}, or None for no cap (1: one at a "
    "time per key). See docs/flow-control.md, 'Keys'."
)
_SHARDS_HINT = (
    "A sharded queue's shards are separate hash tags (separate slots on a cluster): each "
    "shard's claims keep a share of the limits, so each needs at least one. Raise the value, "
    "or use fewer shards. See docs/flow-control.md, 'Sharded queues'."
)


def is_flow_problem(problem: str) -> bool:
    """Whether a settings problem is one E015 reports (E003 then leaves it out)."""
    return problem.startswith(FLOW_SETTINGS)


def flow_errors(where: str, options: dict[str, Any], shards: Any) -> list[Any]:
    """E015 for queue options ``options`` (spread over ``shards``) at ``where``."""
    rate, cap = options.get("rate_limit"), options.get("max_in_flight")
    out = []
    if problem := rate_problem(rate):
        out.append(Error(f"{where}: {problem}.", hint=_RATE_HINT, id="delayqueue.E015"))
    if problem := in_flight_problem(cap):
        out.append(Error(f"{where}: {problem}.", hint=_IN_FLIGHT_HINT, id="delayqueue.E015"))
    if problem := rate_problem(options.get("key_rate_limit"), "key_rate_limit"):
        out.append(Error(f"{where}: {problem}.", hint=_KEY_RATE_HINT, id="delayqueue.E015"))
    if problem := in_flight_problem(options.get("key_concurrency"), "key_concurrency"):
        out.append(Error(f"{where}: {problem}.", hint=_KEY_CONCURRENCY_HINT, id="delayqueue.E015"))
    splittable = not out and isinstance(shards, int) and not isinstance(shards, bool)
    if splittable and (problem := shards_problem(rate, cap, shards)):
        out.append(Error(f"{where}: {problem}.", hint=_SHARDS_HINT, id="delayqueue.E015"))
    return out
