"""The queues: E002, E003, E004 and W002 of each queue's settings (part of check_settings),
W001 and W003 of their handlers."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning

from django_delayqueue.api import topics
from django_delayqueue.conf.settings import (
    CHECK_ONLY_QUEUE_KEYS,
    QUEUE_KEYS,
    dq_settings,
    file_queue_settings,
    handler_time_limit,
    queue_names,
    raw_queue_options,
    settings_problems,
    shards_problem,
)
from django_delayqueue.conf.task_backends import any_task_queue, task_queue_names
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.keys import validate_name


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
    options = raw_queue_options(name)
    values = {
        k: v for k, v in options.items() if k in QUEUE_KEYS and k not in CHECK_ONLY_QUEUE_KEYS
    }
    problems = settings_problems(values)
    shards = shards_problem(options.get("shards", 1))
    if shards:
        problems.append(shards)
    limit = options.get("handler_time_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
        problems.append(f"handler_time_limit must be a number of seconds, not {limit!r}")
    out += [
        Error(f"{where}: {p}.", hint="Fix the value in settings.", id="delayqueue.E003")
        for p in problems
    ]
    if not problems and limit is not None:
        out += _visibility_warning(name, where)
    return out


def _visibility_warning(name: str, where: str) -> list[Any]:
    visibility = file_queue_settings(name).visibility_timeout
    limit = handler_time_limit(name)
    if limit is None or visibility >= limit:
        return []
    return [
        Warning(
            f"{where}: visibility_timeout ({visibility:g}s) is shorter than "
            f"handler_time_limit ({limit:g}s).",
            hint="A consumer that dies mid-handler leaves its messages invisible for "
            "visibility_timeout; running handlers are extended, but set "
            "visibility_timeout >= handler_time_limit so a stuck handler is not delivered "
            "twice at once.",
            id="delayqueue.W002",
        )
    ]


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
