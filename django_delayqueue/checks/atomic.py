"""E019 and W012: atomic queues (docs/exactly-once.md) and the database they run in.

E019 (no I/O): an ``"atomic"`` that is neither True, False nor an alias in ``DATABASES``; a
database that cannot hold a transaction (Django's dummy backend, a backend whose features say
it has none); a database the routers keep the inbox table from. W012 (with the database
checks: ``check --database``, ``migrate``): the inbox table is not there yet. A warning, not an
error: the database checks run before ``migrate`` creates it, and an error would stop the very
command that does; ``runqueue`` refuses to start without it (``inbox.require_tables``).
"""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning
from django.db import connections, router

from django_delayqueue.checks.hints import CONFIGURATION_HINT
from django_delayqueue.conf.settings import atomic_problem, dq_settings, queue_atomic

MIGRATE_HINT = "Run `python manage.py migrate django_delayqueue` on that database."


def atomic_queues() -> dict[str, str]:
    """Each configured queue that is atomic (a valid value) -> its database alias."""
    out: dict[str, str] = {}
    for name in dq_settings.QUEUES or {}:
        try:
            alias = queue_atomic(name)
        except Exception:  # reported by check_atomic, which reads the raw value
            continue
        if alias is not None:
            out[name] = alias
    return out


def check_atomic(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """E019: bad ``atomic`` values, and databases that cannot run an atomic queue."""
    from django_delayqueue.conf.settings import raw_queue_options
    from django_delayqueue.models import InboxEntry

    out = []
    for name in dq_settings.QUEUES or {}:
        try:
            value = raw_queue_options(name).get("atomic", False)
        except Exception:  # an invalid QUEUES entry: the settings checks say so
            continue
        problem = atomic_problem(value)
        if problem:
            out.append(_error(name, f"{problem}.", CONFIGURATION_HINT))
    for name, alias in atomic_queues().items():
        engine = connections.settings[alias].get("ENGINE", "")
        if not engine or engine == "django.db.backends.dummy":
            out.append(_error(name, f"database {alias!r} is not configured (no ENGINE).", ""))
        elif not _has_transactions(alias):
            out.append(_error(name, f"database {alias!r} cannot do transactions.", ""))
        elif not router.allow_migrate_model(alias, InboxEntry):
            out.append(
                _error(
                    name,
                    f"the database routers keep the inbox table off database {alias!r}.",
                    "Let django_delayqueue migrate there, or make the queue atomic on a "
                    "database that has the table.",
                )
            )
    return out


def _has_transactions(alias: str) -> bool:
    """Whether ``alias`` has transactions, without I/O: the backend's declared feature when it
    is a plain value (a backend that must probe its server is trusted here; the probe runs at
    ``check --database``)."""
    for klass in type(connections[alias].features).__mro__:
        declared = klass.__dict__.get("supports_transactions")
        if declared is not None:  # a bool, or a cached_property that asks the server
            return declared if isinstance(declared, bool) else True
    return True


def check_atomic_tables(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """W012 (and E019 when the server says it has no transactions), with the database checks."""
    if not databases:
        return []
    from django_delayqueue.inbox import missing_table

    out: list[Any] = []
    for name, alias in atomic_queues().items():
        if alias not in databases:
            continue
        try:
            if not connections[alias].features.supports_transactions:
                out.append(_error(name, f"database {alias!r} cannot do transactions.", ""))
                continue
            missing = missing_table(alias)
        except Exception as e:  # the database is down: migrate says so better
            out.append(
                Warning(f"queue {name!r}: database {alias!r} not read: {e}", id="delayqueue.W012")
            )
            continue
        if missing:
            out.append(
                Warning(
                    f"queue {name!r} is atomic on database {alias!r}, which has no inbox table "
                    f"({missing}): runqueue will not start for it.",
                    hint=MIGRATE_HINT,
                    id="delayqueue.W012",
                )
            )
    return out


def _error(name: str, problem: str, hint: str) -> Error:
    return Error(
        f"DELAYQUEUE['QUEUES'][{name!r}]['atomic']: {problem}",
        hint=hint
        or "An atomic queue needs a database with transactions and the inbox table "
        "(docs/exactly-once.md).",
        id="delayqueue.E019",
    )
