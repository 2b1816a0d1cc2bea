"""The ``DELAYQUEUE`` settings dict, read lazily over defaults (the DRF way).

    DELAYQUEUE = {
        "REDIS_URL": "rediss://user:password@redis.example.com:6380/0",  # or "CACHE_ALIAS"
        "PREFIX": "dq",
        "DEFAULTS": {"max_attempts": 5},            # per-queue defaults
        "QUEUES": {"order-close": {"visibility_timeout": 120}},
    }

``dq_settings`` is reloaded when ``override_settings`` (or anything sending ``setting_changed``)
changes ``DELAYQUEUE``. ``conf.queues.queue_settings`` gives the *effective* settings of a
queue: the settings file merged with the overrides staff published from the admin (see
``mirror.queue_overrides``).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import fields
from typing import Any

from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS

from django_delayqueue.conf.task_backends import any_task_queue, task_queue_names
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, validate_format
from django_delayqueue.core.errors import ConfigurationError, PayloadError
from django_delayqueue.core.keys import MAX_SHARDS
from django_delayqueue.core.settings import LIMIT_FIELDS, QueueSettings, nan_or_infinite

SETTING_NAME = "DELAYQUEUE"

DEFAULTS: dict[str, Any] = {
    "REDIS_URL": None,  # None (and no CACHE_ALIAS): redis://127.0.0.1:6379/0
    "CACHE_ALIAS": None,  # a django-redis cache alias to borrow the connection of
    "REDIS_OPTIONS": {},  # extra keyword arguments for redis.Redis.from_url
    # Redis Sentinel instead of REDIS_URL: {"hosts": [["h", 26379], ...], "service_name":
    # "mymaster", "db": 0, "password": ..., "username": ..., "sentinel_kwargs": {...}}.
    "SENTINEL": None,
    # Redis Cluster: REDIS_URL names any node (or is a list of start nodes' URLs).
    "CLUSTER": False,
    # Replicas that must confirm a schedule (and the consumers' acks) before it returns; a
    # timeout raises NotReplicated (core.replication).
    "MIN_REPLICAS": 0,
    "MIN_REPLICAS_TIMEOUT_SECONDS": 1.0,
    "PREFIX": "dq",
    "QUEUES": {},
    "DEFAULTS": {},
    "ON_COMMIT": True,
    "JOURNAL_MAXLEN": 100_000,
    "CLOCK": "redis",  # "redis" (shared server time) | "system" (local wall clock)
    "HEALTH_MAX_OVERDUE_SECONDS": 60,
    "HEALTH_CONSUMER_SECONDS": 30,  # a consumer is alive if it beat within this many seconds
    # The health probe fails when a Redis server uses this share of its maxmemory (None: off).
    "HEALTH_MAX_MEMORY_PERCENT": None,
    # The health probe fails when a queue's p99 start lateness over the last 5 minutes passes
    # its lateness_warning_ms (off unless True: late handlers are a warning, not an outage).
    "HEALTH_LATENESS": False,
    # metrics/ and health/: how long their Redis reads wait for a reply (a frozen Redis must
    # not hold the page longer than a scraper or a probe waits for it), and an optional bearer
    # token they ask for (docs/operations.md).
    "MONITORING_TIMEOUT_SECONDS": 2.0,
    "MONITORING_TOKEN": None,
    # runqueue refuses a Redis whose maxmemory-policy evicts keys (and messages with them)
    # unless this is True: the operator accepts that messages may vanish (docs/redis.md).
    "ACCEPT_DATA_LOSS_ON_EVICTION": False,
    "SETTINGS_REFRESH_SECONDS": 2,
    "REPORT_DIR": None,  # queue_report's --out directory; the admin shows its charts
    # Recurring schedules kept by runqueue: name -> {"queue", "cron" | "every", "timezone",
    # "payload" | "task", "catch_up", ...} (django_delayqueue.mirror, docs/recurring.md).
    "SCHEDULES": {},
    # The transactional outbox (django_delayqueue.outbox): a message scheduled in a transaction
    # is written to the database with it, so a Redis down at commit time loses nothing.
    "OUTBOX": True,
    "OUTBOX_RELAY_SECONDS": 1.0,  # how often each runqueue's relay looks for unsent rows
    "OUTBOX_LEASE_SECONDS": 30.0,  # a row's sender holds it this long before a relay may
    "OUTBOX_MAX_AGE_SECONDS": 60,  # older unsent rows: check warning, health problem
    # OpenTelemetry (docs/observability.md): a delivery span is linked to the span that
    # scheduled its message ("link") or is its child ("child").
    "OTEL_PARENT": "link",
    # The newest envelope format this process reads (its consumers) and may write (docs/
    # upgrades.md); None: the newest this release knows. An older one pins runqueue to an
    # earlier release's format, for a drill of a mixed fleet.
    "ENVELOPE_FORMAT": None,
    # Atomic queues (docs/exactly-once.md): an inbox row is kept at least this long, and as
    # long as its message is still in Redis (waiting, retrying, dead), so that a redelivery
    # (an outbox row relayed twice included) finds it.
    "INBOX_KEEP_SECONDS": 86_400,
}
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# Per-queue keys: the engine's settings, plus what only the system checks read.
QUEUE_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(QueueSettings))
# Per-queue keys that are not engine settings: the number of shards a queue is spread over
# (core.sharding).
CHECK_ONLY_QUEUE_KEYS: tuple[str, ...] = ("shards", "atomic")
# Old names of queue settings, still read as the new one (check W008, a DeprecationWarning).
RENAMED_QUEUE_KEYS: dict[str, str] = {"handler_time_limit": "time_limit"}
QUEUE_KEYS: frozenset[str] = frozenset(
    QUEUE_SETTING_NAMES + CHECK_ONLY_QUEUE_KEYS + tuple(RENAMED_QUEUE_KEYS)
)


class DelayQueueSettings:
    """Attribute access to ``settings.DELAYQUEUE`` over :data:`DEFAULTS`, read on first use."""

    def __init__(self) -> None:
        self._cached: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, SETTING_NAME, None) or {}
        if not isinstance(value, dict):
            raise ConfigurationError(f"settings.{SETTING_NAME} must be a dict")
        return value

    def _merged(self) -> dict[str, Any]:
        cached = self._cached
        if cached is None:
            with self._lock:
                cached = {**DEFAULTS, **self.user_settings}
                self._cached = cached
        return cached

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(f"invalid {SETTING_NAME} setting: {name!r}")
        return self._merged()[name]

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.user_settings) - set(DEFAULTS))

    def reload(self) -> None:
        with self._lock:
            self._cached = None


dq_settings = DelayQueueSettings()


def queue_names() -> list[str]:
    """The configured queue names, in settings order, then those only a TASKS backend names.

    A task queue need not be in ``DELAYQUEUE['QUEUES']``: there it gets its settings, without
    them the ``DEFAULTS``. Not here: the queues a backend with ``"QUEUES": []`` enqueued to
    without naming them (``conf.task_registry``).
    """
    names = [str(name) for name in dq_settings.QUEUES or {}]
    return list(dict.fromkeys([*names, *task_queue_names()]))


def raw_queue_options(name: str) -> dict[str, Any]:
    """``DEFAULTS`` merged with the queue's own dict, unknown keys included (for the checks).

    Old names (:data:`RENAMED_QUEUE_KEYS`) are read as their new one, in each dict apart (a
    queue's ``handler_time_limit`` wins over a ``time_limit`` of the ``DEFAULTS``); where a
    dict has both, the new name wins.
    """
    queues = dq_settings.QUEUES or {}
    defaults = renamed_keys(dq_settings.DEFAULTS or {})
    if name not in queues:
        # Callers check the name first (conf.queues.configured): with a backend that takes
        # any queue ("QUEUES": []), an unlisted task queue gets the DEFAULTS too.
        if name in task_queue_names() or any_task_queue():
            return dict(defaults)
        raise unknown_queue(name)
    return {**defaults, **renamed_keys(queues[name] or {})}


def renamed_keys(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with each old key (:data:`RENAMED_QUEUE_KEYS`) under its new name."""
    if not isinstance(options, dict) or not RENAMED_QUEUE_KEYS.keys() & options.keys():
        return options
    out = dict(options)
    for old, new in RENAMED_QUEUE_KEYS.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


def deprecated_keys(name: str) -> list[tuple[str, str, str]]:
    """Where queue ``name``'s settings use an old key: (where, old, new) for each."""
    found = []
    sources = [("['DEFAULTS']", dq_settings.DEFAULTS), (f"['QUEUES'][{name!r}]", None)]
    queues = dq_settings.QUEUES or {}
    if isinstance(queues, dict):
        sources[1] = (sources[1][0], queues.get(name))
    for where, options in sources:
        if isinstance(options, dict):
            found += [
                (f"DELAYQUEUE{where}", old, new)
                for old, new in RENAMED_QUEUE_KEYS.items()
                if old in options
            ]
    return found


def unknown_queue(name: str) -> ConfigurationError:
    configured = ", ".join(queue_names()) or "none"
    return ConfigurationError(
        f"unknown queue {name!r}; configured: {configured} (add it to DELAYQUEUE['QUEUES'])"
    )


def file_queue_settings(name: str) -> QueueSettings:
    """The queue's settings as the settings file declares them (no admin overrides).

    Keys QueueSettings does not know are ignored here; the system checks report them. An old
    key is read as its new name, with a DeprecationWarning (and the check W008).
    """
    for where, old, new in deprecated_keys(name):
        warnings.warn(
            f"{where}: {old!r} is deprecated, rename it {new!r} (read as {new!r} meanwhile)",
            DeprecationWarning,
            stacklevel=2,
        )
    options = raw_queue_options(name)
    known = {k: v for k, v in options.items() if k in QUEUE_SETTING_NAMES}
    try:
        return QueueSettings(**known)
    except (TypeError, ConfigurationError) as e:
        raise ConfigurationError(f"DELAYQUEUE['QUEUES'][{name!r}]: {e}") from e


def settings_problems(values: dict[str, Any]) -> list[str]:
    """Every problem with queue settings ``values`` (types, then ranges), without raising."""
    defaults = QueueSettings().to_mapping()
    values = {k: v for k, v in values.items() if v is not None}  # missing: the default
    problems = []
    for name, value in values.items():
        expected = type(defaults.get(name))
        if name not in defaults:
            continue
        if name in LIMIT_FIELDS:  # None (no limit, the default) or a number of seconds
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append(f"{name} must be a number of seconds or None, not {value!r}")
        elif expected is bool and not isinstance(value, bool):
            problems.append(f"{name} must be True or False, not {value!r}")
        elif expected in (int, float) and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            problems.append(f"{name} must be a number, not {value!r}")
        elif expected is int and isinstance(value, float) and not value.is_integer():
            problems.append(f"{name} must be a whole number, not {value!r}")
    if problems:
        return problems
    # Skip __post_init__ (which raises on the first problem) to list them all.
    obj = object.__new__(QueueSettings)
    for name, value in {**defaults, **values}.items():
        object.__setattr__(obj, name, value)
    return obj.problems()


def queue_atomic(name: str) -> str | None:
    """The database alias an atomic queue's handlers run in a transaction on (``"atomic"``:
    True for Django's default database, or an alias), None for a queue that is not atomic.
    ConfigurationError for another value (the check E018 reports it too). A queue that is
    not configured (a Worker built on a bare Queue) is not atomic: its callers check names."""
    if name not in (dq_settings.QUEUES or {}) and not (
        name in task_queue_names() or any_task_queue()
    ):
        return None
    value = raw_queue_options(name).get("atomic", False)
    problem = atomic_problem(value)
    if problem:
        raise ConfigurationError(f"DELAYQUEUE['QUEUES'][{name!r}]: {problem}")
    if value is True:
        return DEFAULT_DB_ALIAS
    return value or None


def atomic_problem(value: object) -> str | None:
    """What is wrong with an ``"atomic"`` value (its type, or an alias not in DATABASES)."""
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, str) or not value:
        return f"atomic must be True, False or a database alias, not {value!r}"
    if value not in django_settings.DATABASES:
        return f"atomic names database {value!r}, which is not in DATABASES"
    return None


def queue_shards(name: str) -> int:
    """How many shards queue ``name`` is spread over (``"shards"``, default 1)."""
    value = raw_queue_options(name).get("shards", 1)
    problem = shards_problem(value)
    if problem:
        raise ConfigurationError(f"DELAYQUEUE['QUEUES'][{name!r}]: {problem}")
    return int(value)


def shards_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHARDS:
        return f"shards must be a whole number from 1 to {MAX_SHARDS}, not {value!r}"
    return None


def envelope_format() -> int:
    """``DELAYQUEUE["ENVELOPE_FORMAT"]``: the newest envelope format this process reads and may
    write (None: the newest this release knows). A bad value is the check E016's to report:
    the default then, so that runqueue still starts and reads everything."""
    value = dq_settings.ENVELOPE_FORMAT
    return ENVELOPE_FORMAT if value is None or envelope_format_problem(value) else value


def envelope_format_problem(value: object) -> str | None:
    """What is wrong with ``value`` as ``ENVELOPE_FORMAT`` (None: nothing)."""
    if value is None:
        return None
    try:
        validate_format(value, "DELAYQUEUE['ENVELOPE_FORMAT']")
    except PayloadError as e:
        return str(e)
    return None


def seconds_setting_problem(name: str, *, optional: bool = False, zero: bool = False) -> str | None:
    """What is wrong with the ``DELAYQUEUE`` setting ``name`` as a number of seconds, or None:
    it must be a finite number above 0 (or 0 too, with ``zero``; or None, with ``optional``).
    NaN and infinity are named: NaN compares false with everything, so a threshold of NaN
    would never be passed and an interval of NaN never end."""
    value = getattr(dq_settings, name)
    if value is None and optional:
        return None
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if number and not nan_or_infinite(value) and (value > 0 or (zero and value == 0)):
        return None
    wanted = "0 or more" if zero else "above 0"
    return (
        f"DELAYQUEUE[{name!r}] must be a finite number of seconds, {wanted}"
        f"{' (or None: off)' if optional else ''}, not {value!r}"
    )
