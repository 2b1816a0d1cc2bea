"""System checks (``manage.py check``): bad configuration is reported here, with a hint.

==================  ================================================================
delayqueue.E001     Redis unreachable (``check --deploy [--tag delayqueue]``)
delayqueue.E002     unknown key in ``DELAYQUEUE``, its ``DEFAULTS`` or a queue
delayqueue.E003     invalid per-queue settings values
delayqueue.E004     invalid connection settings (URL, cache alias, clock, prefix, names)
delayqueue.E005     invalid ``RESULT_TTL`` of a ``TASKS`` backend of this app
delayqueue.E006     ``ON_COMMIT`` of a ``TASKS`` backend without any database
delayqueue.E007     a ``TASKS`` backend's queue name that is not a valid queue name
delayqueue.E008     invalid outbox settings (``OUTBOX``, ``OUTBOX_*_SECONDS``)
delayqueue.E009     a recurring schedule in ``SCHEDULES`` that is invalid, has no queue, or
                    puts a task where no backend runs it (or a payload where only tasks run)
delayqueue.E010     a Redis whose ``maxmemory-policy`` evicts keys (``check --deploy``)
delayqueue.E011     invalid ``ACCEPT_DATA_LOSS_ON_EVICTION`` or ``HEALTH_MAX_MEMORY_PERCENT``
delayqueue.E012     ``django_delayqueue`` missing from INSTALLED_APPS (a TASKS backend's check)
delayqueue.W005     the problems of E009 in a recurring schedule row (``--database``)
delayqueue.W001     a configured queue has no handler (queues of a TASKS backend need none)
delayqueue.W002     a visibility timeout shorter than the queue's handler time limit
delayqueue.W003     handlers registered for a queue that is not configured
delayqueue.W004     outbox messages older than ``OUTBOX_MAX_AGE_SECONDS``: no relay sent
                    them (``check --database default``, and ``migrate``)
delayqueue.W006     a Redis without AOF or RDB snapshots (``check --deploy``; not the
                    embedded one of the demo and the tests)
delayqueue.W007     E010 accepted by ``ACCEPT_DATA_LOSS_ON_EVICTION`` (``check --deploy``)
==================  ================================================================

Only E001, E010, W006, W007 and W004 do I/O: the first four (monitoring.server_checks) run
with the deployment checks (and on demand), W004 with the database checks: a Redis that is
down must not stop ``migrate`` or ``runqueue``, which waits for it (and judges the servers
itself once they answer: monitoring.servers.ServerGuard). E005-E007 and E012 are the Tasks
backend's own ``check()``: run by the framework's check once the framework is imported (and,
for the backport, in INSTALLED_APPS), and by ``check_task_backends`` here when it is not.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from django_delayqueue.api import topics
from django_delayqueue.conf.connection import (
    cluster_conflicts,
    make_client,
    redis_urls,
    replica_ack,
    sentinel_config,
)
from django_delayqueue.conf.settings import (
    CHECK_ONLY_QUEUE_KEYS,
    DEFAULTS,
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
from django_delayqueue.core.keys import validate_name, validate_prefix
from django_delayqueue.monitoring.server_checks import check_redis_servers, server_setting_errors

TAG = "delayqueue"
PING_TIMEOUT = 1.0  # seconds: a check must stay fast even against a black-holed host
_DOC = "See DELAYQUEUE in docs/configuration.md of django-delayqueue."


def register_checks() -> None:
    register(check_settings, TAG)
    register(check_handlers, TAG)
    register(check_redis, TAG, deploy=True)
    register(check_redis_servers, TAG, deploy=True)
    register(check_task_backends, TAG)
    from django_delayqueue.recurring.checks import check_schedule_rows, check_schedules

    register(check_schedules, TAG)
    register(check_schedule_rows, Tags.database)
    # Only with the database checks (`check --database`, `migrate`): not with `--tag delayqueue`,
    # which must not query a database nobody asked for.
    register(check_outbox, Tags.database)


def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """E005-E007 of every TASKS backend of this app, unless the framework's check runs them.

    ``django.tasks`` registers its check when it is first imported, and the ``django-tasks``
    backport when its app is installed: a project whose tasks module is not imported by
    ``manage.py check`` (or without ``django_tasks`` in INSTALLED_APPS) would not see them.
    """
    if not getattr(settings, "TASKS", None) or _framework_checks_registered():
        return []
    try:
        from django_delayqueue.tasks import framework
        from django_delayqueue.tasks.backend import DelayQueueBackend
    except ImportError:  # no Tasks framework installed: TASKS cannot name this backend
        return []
    found: list[Any] = []
    for alias in settings.TASKS:
        try:
            backend = framework.task_backends[alias]
        except Exception:  # the framework's own check reports a backend that cannot load
            continue
        if isinstance(backend, DelayQueueBackend):
            found += list(backend.check())
    return found


def _framework_checks_registered() -> bool:
    from django.core.checks import registry

    framework_checks = ("django.tasks.checks", "django_tasks.checks")
    registered = registry.registry.get_checks(include_deployment_checks=True)
    return any(getattr(check, "__module__", "") in framework_checks for check in registered)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """E002, E003, E004, E011 and W002: the DELAYQUEUE dict itself."""
    raw = getattr(settings, "DELAYQUEUE", None)
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [Error("DELAYQUEUE must be a dict.", hint=_DOC, id="delayqueue.E004")]
    out = [
        Error(
            f"Unknown DELAYQUEUE setting {key!r}.",
            hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
            id="delayqueue.E002",
        )
        for key in dq_settings.unknown_keys()
    ]
    out += _connection_errors()
    out += _outbox_errors()
    out += server_setting_errors()
    queues = dq_settings.QUEUES
    if not isinstance(queues, dict) or not isinstance(dq_settings.DEFAULTS or {}, dict):
        out.append(
            Error(
                "DELAYQUEUE['QUEUES'] and DELAYQUEUE['DEFAULTS'] must be dicts.",
                hint='e.g. "QUEUES": {"order-close": {"max_attempts": 5}}',
                id="delayqueue.E004",
            )
        )
        return out
    out += _unknown_queue_keys("DELAYQUEUE['DEFAULTS']", dq_settings.DEFAULTS or {})
    for name in queues:
        out += _queue_errors(name)
    return out


def _connection_errors() -> list[Any]:
    out = []
    url, alias = dq_settings.REDIS_URL, dq_settings.CACHE_ALIAS
    if url and alias:
        out.append(
            Error(
                "DELAYQUEUE sets both REDIS_URL and CACHE_ALIAS.",
                hint="Use one: CACHE_ALIAS borrows a django-redis cache's connection.",
                id="delayqueue.E004",
            )
        )
    if alias and alias not in getattr(settings, "CACHES", {}):
        out.append(
            Error(
                f"DELAYQUEUE['CACHE_ALIAS'] {alias!r} is not in CACHES.",
                hint="Name a django-redis cache, or use REDIS_URL.",
                id="delayqueue.E004",
            )
        )
    if url and not alias:
        try:
            redis_urls()
        except ConfigurationError as e:
            out.append(
                Error(
                    f"DELAYQUEUE['REDIS_URL'] {url!r} is not a Redis URL: {e}.",
                    hint="e.g. redis://localhost:6379/0 or rediss://user:password@host:6380/0",
                    id="delayqueue.E004",
                )
            )
    if dq_settings.CLOCK not in ("redis", "system"):
        out.append(
            Error(
                f"DELAYQUEUE['CLOCK'] must be 'redis' or 'system', not {dq_settings.CLOCK!r}.",
                hint="'redis' (the default) keeps hosts with different clocks in agreement.",
                id="delayqueue.E004",
            )
        )
    try:
        validate_prefix(dq_settings.PREFIX)
    except ConfigurationError as e:
        out.append(Error(f"DELAYQUEUE['PREFIX']: {e}.", id="delayqueue.E004"))
    for read in (sentinel_config, replica_ack, cluster_conflicts):
        try:
            read()
        except ConfigurationError as e:
            out.append(Error(f"DELAYQUEUE: {e}.", hint=_DOC, id="delayqueue.E004"))
    return out


def _unknown_queue_keys(where: str, options: dict[str, Any]) -> list[Any]:
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


def _queue_errors(name: Any) -> list[Any]:
    where = f"DELAYQUEUE['QUEUES'][{name!r}]"
    try:
        validate_name(name, "queue name")
    except ConfigurationError as e:
        return [Error(f"{where}: {e}.", hint=_RENAME_HINT, id="delayqueue.E004")]
    own = dq_settings.QUEUES[name]
    if own is not None and not isinstance(own, dict):
        return [Error(f"{where} must be a dict of queue settings.", id="delayqueue.E003")]
    out = _unknown_queue_keys(where, own or {})
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


def check_redis(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """E001: PING Redis with a short timeout."""
    try:
        client = make_client(socket_connect_timeout=PING_TIMEOUT, socket_timeout=PING_TIMEOUT)
    except ConfigurationError:
        return []  # reported by E004
    except Exception as e:  # a cluster client connects as it is built
        return [_unreachable(e)]
    try:
        client.ping()
    except Exception as e:  # any failure to talk to Redis is the finding
        return [_unreachable(e)]
    finally:
        if not dq_settings.CACHE_ALIAS:  # a borrowed cache connection is not ours to close
            client.close()
    return []


def _unreachable(error: Exception) -> Error:
    return Error(
        f"Redis is unreachable: {error}",
        hint="Check DELAYQUEUE['REDIS_URL'] (or CACHE_ALIAS), credentials and "
        "network; runqueue waits and retries, but nothing is delivered meanwhile.",
        id="delayqueue.E001",
    )


OUTBOX_SECONDS = ("OUTBOX_RELAY_SECONDS", "OUTBOX_LEASE_SECONDS", "OUTBOX_MAX_AGE_SECONDS")


def _outbox_errors() -> list[Any]:
    """E008: the outbox switch and its timings."""
    out = []
    if not isinstance(dq_settings.OUTBOX, bool):
        out.append(
            Error(
                f"DELAYQUEUE['OUTBOX'] must be True or False, not {dq_settings.OUTBOX!r}.",
                hint=_DOC,
                id="delayqueue.E008",
            )
        )
    for name in OUTBOX_SECONDS:
        value = getattr(dq_settings, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            out.append(
                Error(
                    f"DELAYQUEUE[{name!r}] must be a positive number of seconds, not {value!r}.",
                    hint=_DOC,
                    id="delayqueue.E008",
                )
            )
    return out


def check_outbox(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """W004: outbox rows that have waited longer than OUTBOX_MAX_AGE_SECONDS."""
    if not databases or _outbox_errors():
        return []
    from django.utils import timezone

    from django_delayqueue.outbox.backlog import outbox_backlog
    from django_delayqueue.outbox.relay import outbox_databases

    limit = float(dq_settings.OUTBOX_MAX_AGE_SECONDS)
    now = timezone.now()
    out = []
    for backlog in outbox_backlog([d for d in outbox_databases() if d in databases]):
        age = backlog.age_seconds(now)
        if not backlog.count or age <= limit:
            continue
        relayed = backlog.last_relayed
        if relayed is None or (now - relayed).total_seconds() > limit:
            hint = (
                "No relay has tried to send them lately: run `manage.py runqueue` (every "
                "runqueue relays the outbox)."
            )
        else:
            hint = f"A relay runs but cannot send them: {backlog.last_error or 'see its log'}."
        out.append(
            Warning(
                f"{backlog.count} outbox message(s) in database {backlog.database!r} have "
                f"waited {age:.0f}s to be sent to Redis.",
                hint=hint,
                id="delayqueue.W004",
            )
        )
    return out
