"""E002, E004 and what check_settings gathers: the ``DELAYQUEUE`` dict itself, its connection
settings, and the settings of each area (queues, outbox, Redis servers)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error

from django_delayqueue.checks.formats import format_setting_errors
from django_delayqueue.checks.hints import CONFIGURATION_HINT
from django_delayqueue.checks.monitoring import monitoring_errors
from django_delayqueue.checks.outbox import outbox_errors
from django_delayqueue.checks.queues import queue_errors, unknown_queue_keys
from django_delayqueue.checks.servers import server_setting_errors
from django_delayqueue.conf.connection import (
    cluster_conflicts,
    redis_urls,
    replica_ack,
    sentinel_config,
)
from django_delayqueue.conf.settings import DEFAULTS, dq_settings, seconds_setting_problem
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.keys import validate_prefix
from django_delayqueue.observability.tracing import PARENT_MODES


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """E002, E003, E004, E008, E011, E013, E014, E016 and W008: the DELAYQUEUE dict itself."""
    raw = getattr(settings, "DELAYQUEUE", None)
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [Error("DELAYQUEUE must be a dict.", hint=CONFIGURATION_HINT, id="delayqueue.E004")]
    out = [
        Error(
            f"Unknown DELAYQUEUE setting {key!r}.",
            hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
            id="delayqueue.E002",
        )
        for key in dq_settings.unknown_keys()
    ]
    out += _connection_errors()
    out += outbox_errors()
    out += server_setting_errors()
    out += format_setting_errors()
    out += monitoring_errors()
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
    out += unknown_queue_keys("DELAYQUEUE['DEFAULTS']", dq_settings.DEFAULTS or {})
    for name in queues:
        out += queue_errors(name)
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
    if dq_settings.OTEL_PARENT not in PARENT_MODES:
        out.append(
            Error(
                f"DELAYQUEUE['OTEL_PARENT'] must be 'link' or 'child', not "
                f"{dq_settings.OTEL_PARENT!r}.",
                hint="'link' (the default): a delivery span links to the span that scheduled "
                "it; 'child': it is that span's child (docs/observability.md).",
                id="delayqueue.E004",
            )
        )
    refresh = seconds_setting_problem("SETTINGS_REFRESH_SECONDS", zero=True)
    if refresh:
        out.append(
            Error(
                f"{refresh}.",
                hint="How often every process re-reads the settings published from the admin "
                "(default 2).",
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
            out.append(Error(f"DELAYQUEUE: {e}.", hint=CONFIGURATION_HINT, id="delayqueue.E004"))
    return out
