"""E015: a queue's flow limits (``rate_limit``, ``max_in_flight``, ``key_concurrency``,
``key_rate_limit``): a value that cannot be read, or one that cannot be split between the
queue's shards (core/flow_limits.py). A key's limits are never split: a key lives on one
shard.

W011: a sharded queue with a ``rate_limit`` or ``max_in_flight`` that takes flow keys (its
settings say so: key limits, a recurring schedule's ``key``, a Tasks backend's
``KEY_ARGUMENT``): every message of a key lives on one shard, so a key's backlog starts within
that shard's share of the queue's limits, not at the queue's full rate. Said with the figures,
unless the key's own limits are no higher than the share (then the key gets what it asks)."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning

from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.conf.task_backends import (
    backend_queues,
    delayqueue_backends,
    takes_any_queue,
)
from django_delayqueue.core.flow_limits import (
    MAX_IN_FLIGHT,
    RATE_FORMAT,
    in_flight_problem,
    parse_rate,
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
_KEY_SHARE_HINT = (
    "A sharded queue runs at its full rate over messages spread across its shards (many keys, "
    "or none); one key's messages cannot spread (its limits are exact on its shard), and a "
    "shard's claims cannot borrow another's share (separate slots on a cluster). If one key "
    "must go faster, use fewer shards for this queue, or none. If the share is what a key "
    "should get, say so with key_rate_limit / key_concurrency no higher than it (this warning "
    "then goes). See docs/flow-control.md, 'Sharded queues'."
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


def key_share_warnings(name: str, where: str, options: dict[str, Any], shards: Any) -> list[Any]:
    """W011 for queue ``name`` (its options ``options``, spread over ``shards``): what a flow
    key gets of a sharded queue's limits, when its settings show it takes keys."""
    rate, cap = options.get("rate_limit"), options.get("max_in_flight")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards <= 1:
        return []
    if (rate is None and cap is None) or rate_problem(rate) or in_flight_problem(cap):
        return []
    key_rate, key_cap = options.get("key_rate_limit"), options.get("key_concurrency")
    if rate_problem(key_rate, "key_rate_limit") or in_flight_problem(key_cap, "key_concurrency"):
        return []
    if not (key_rate is not None or key_cap is not None or _keyed_elsewhere(name)):
        return []
    shares = []
    if rate is not None:
        limit = parse_rate(rate)
        share = limit.per_second / shards
        if key_rate is None or parse_rate(key_rate).per_second > share:
            shares.append(f"about {share:g}/s of its rate_limit {rate!r}")
    if cap is not None:
        share_cap = -(-cap // shards)  # the first shards get the remainder
        if key_cap is None or key_cap > share_cap:
            shares.append(f"at most {share_cap} in flight of its max_in_flight {cap}")
    if not shares:
        return []
    return [
        Warning(
            f"{where}: a flow key's messages all live on one of the queue's {shards} shards, "
            f"so a key starts within that shard's share of the queue's limits: "
            f"{' and '.join(shares)}, not the whole.",
            hint=_KEY_SHARE_HINT,
            id="delayqueue.W011",
        )
    ]


def _keyed_elsewhere(name: str) -> bool:
    """Whether settings other than the queue's own give its messages flow keys: a recurring
    schedule with a ``key`` on it, or a Tasks backend of this app with ``KEY_ARGUMENT`` that
    sends to it (its QUEUES, or any queue). Messages scheduled with ``key=`` in code cannot
    be seen from the settings: docs/flow-control.md says what they get."""
    schedules = dq_settings.SCHEDULES
    if isinstance(schedules, dict):
        for options in schedules.values():
            if isinstance(options, dict) and options.get("key") and options.get("queue") == name:
                return True
    for params in delayqueue_backends().values():
        options = params.get("OPTIONS") or {}
        keyed = isinstance(options, dict) and bool(options.get("KEY_ARGUMENT"))
        if keyed and (takes_any_queue(params) or name in backend_queues(params)):
            return True
    return False
