"""The queues: E002-E004, E013, E014, E015 and W011 (checks/flow.py), W008 and W009 of each queue's
settings (part of check_settings), W001 and W003 of their handlers."""

from __future__ import annotations

import warnings
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning

from django_delayqueue.api import topics
from django_delayqueue.checks.flow import flow_errors, is_flow_problem, key_share_warnings
from django_delayqueue.conf.settings import (
    CHECK_ONLY_QUEUE_KEYS,
    QUEUE_KEYS,
    RENAMED_QUEUE_KEYS,
    deprecated_keys,
    dq_settings,
    file_queue_settings,
    queue_names,
    raw_queue_options,
    settings_problems,
    shards_problem,
)
from django_delayqueue.conf.task_backends import any_task_queue, task_queue_names
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.keys import validate_name
from django_delayqueue.core.settings import LIMIT_MARGIN_SECONDS, TIME_LIMIT_ORDER


def unknown_queue_keys(where: str, options: dict[str, Any]) -> list[Any]:
    return [
        Error(
            f"Unknown queue setting {key!r} in {where}.",
            hint=f"Known queue settings: {', '.join(sorted(QUEUE_KEYS))}.",
            id="delayqueue.E002",
        )
        for key in sorted(set(options) - QUEUE_KEYS)
    ]


# Earlier releases accepted ':' in a queue name (whose keys could be another site's).
_RENAME_HINT = (
    "Rename the queue in DELAYQUEUE['QUEUES'] and wherever it is scheduled. Messages stored "
    "under an old name stay in Redis untouched, unseen by the new name: drain the queue with "
    "the release you upgrade from before renaming it."
)


def queue_errors(name: Any) -> list[Any]:
    where = f"DELAYQUEUE['QUEUES'][{name!r}]"
    try:
        validate_name(name, "queue name")
    except ConfigurationError as e:
        return [Error(f"{where}: {e}.", hint=_RENAME_HINT, id="delayqueue.E004")]
    own = dq_settings.QUEUES[name]
    if own is not None and not isinstance(own, dict):
        return [Error(f"{where} must be a dict of queue settings.", id="delayqueue.E003")]
    out = unknown_queue_keys(where, own or {})
    out += _deprecated_warnings(name)
    options = raw_queue_options(name)
    values = {
        k: v
        for k, v in options.items()
        if k in QUEUE_KEYS and k not in CHECK_ONLY_QUEUE_KEYS and k not in RENAMED_QUEUE_KEYS
    }
    problems = settings_problems(values)
    shards = shards_problem(options.get("shards", 1))
    if shards:
        problems.append(shards)
    out += [
        Error(f"{where}: {p}.", hint="Fix the value in settings.", id="delayqueue.E003")
        for p in problems
        if p != TIME_LIMIT_ORDER and not is_flow_problem(p)
    ]
    out += flow_errors(where, values, options.get("shards", 1))
    if not problems:
        out += key_share_warnings(name, where, values, options.get("shards", 1))
    if TIME_LIMIT_ORDER in problems:
        out.append(
            Error(
                f"{where}: time_limit ({values['time_limit']:g}s) must be greater than "
                f"soft_time_limit ({values['soft_time_limit']:g}s).",
                hint="soft_time_limit warns the handler (dq.SoftTimeLimitExceeded) so that it "
                "can clean up before time_limit stops it: raise time_limit above it, or remove "
                "soft_time_limit.",
                id="delayqueue.E013",
            )
        )
    if not problems:
        out += _coverage_error(name, where)
    return out


def _deprecated_warnings(name: str) -> list[Any]:
    return [
        Warning(
            f"{where}: {old!r} is deprecated; it is read as {new!r}.",
            hint=f"Rename {old!r} to {new!r}: since issue 26 it is enforced (the handler is "
            "stopped at the limit and its message retried), no longer only checked.",
            id="delayqueue.W008",
        )
        for where, old, new in deprecated_keys(name)
    ]


def _coverage_error(name: str, where: str) -> list[Any]:
    """E014: a lease that could never be renewed must outlast the time limit (and the stop)."""
    with warnings.catch_warnings():  # W008 says it for the checks
        warnings.simplefilter("ignore", DeprecationWarning)
        queue = file_queue_settings(name)
    if not queue.uncovered_limit():
        return []
    limit = queue.time_limit or 0
    # A limit set with the deprecated handler_time_limit was only checked before (W002 asked
    # for visibility_timeout >= it): a warning, so that an upgrade does not refuse to start.
    deprecated_only = bool(deprecated_keys(name)) and not _uses_time_limit(name)
    kind = Warning if deprecated_only else Error
    return [
        kind(
            f"{where}: visibility_timeout ({queue.visibility_timeout:g}s) cannot cover "
            f"time_limit ({limit:g}s).",
            hint=f"Set visibility_timeout to at least time_limit + {LIMIT_MARGIN_SECONDS:g}s "
            f"({limit + LIMIT_MARGIN_SECONDS:g}s), or lower time_limit. Running handlers' "
            "leases are renewed while their consumer reaches Redis; a consumer cut off from it "
            "(or frozen) renews nothing, and its handler must be stopped by time_limit before "
            "the lease runs out, or the message is delivered again while it still runs.",
            id="delayqueue.W009" if deprecated_only else "delayqueue.E014",
        )
    ]


def _uses_time_limit(name: str) -> bool:
    """Whether ``time_limit`` itself (not the old key) is set for queue ``name``."""
    queues = dq_settings.QUEUES if isinstance(dq_settings.QUEUES, dict) else {}
    sources = [dq_settings.DEFAULTS, queues.get(name)]
    return any(isinstance(o, dict) and "time_limit" in o for o in sources)


def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """W001 and W003: queues without receivers, receivers without a queue."""
    if not isinstance(getattr(settings, "DELAYQUEUE", {}), dict):
        return []  # E004
    if not isinstance(dq_settings.QUEUES, dict):
        return []
    configured = set(queue_names())
    task_queues = set(task_queue_names())  # a TASKS backend runs their tasks
    if any_task_queue():  # "QUEUES": [] takes any queue: each may be a task queue
        task_queues |= configured
    signals = topics()
    out = [
        Warning(
            f"Queue {name!r} has no handler.",
            hint=f"Connect one with @receiver(dq.topic({name!r})) in an installed app's "
            "handlers.py; until then its messages go to garbage ('no handler').",
            id="delayqueue.W001",
        )
        for name in sorted(configured - task_queues)
        if name not in signals or not signals[name].has_listeners()
    ]
    out += [
        Warning(
            f"Handlers are registered for queue {name!r}, which is not configured.",
            hint="Add it to DELAYQUEUE['QUEUES'] or fix the name in dq.topic(...).",
            id="delayqueue.W003",
        )
        for name, signal in sorted(signals.items())
        if name not in configured and signal.has_listeners()
    ]
    return out
