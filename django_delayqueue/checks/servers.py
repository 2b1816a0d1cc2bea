"""System checks of the Redis servers the app uses: E001 (reachable), E010, W006 and W007
(each server's eviction policy and persistence, judged in monitoring.servers), E011 (their
settings and the health probe's, part of check_settings).

They talk to Redis, so they run with the deployment checks (``check --deploy``): a Redis that
is down must not stop ``migrate`` or ``runserver``, and ``--tag delayqueue`` alone queries
nothing. A server that does not answer is E001's to report, never a crash of the others.
``runqueue`` runs the same judgement at start (monitoring.servers.ServerGuard).
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning

from django_delayqueue.conf.connection import make_client
from django_delayqueue.conf.settings import dq_settings, seconds_setting_problem
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.monitoring.servers import ACCEPT, CHECK_IDS, EVICTING, app_servers, findings

PING_TIMEOUT = 1.0  # seconds: a check must stay fast even against a black-holed host
HEALTH_SECONDS = ("HEALTH_MAX_OVERDUE_SECONDS", "HEALTH_CONSUMER_SECONDS")


def server_setting_errors() -> list[Error]:
    """E011: the settings of the Redis servers checks (part of check_settings)."""
    out: list[Error] = []
    accept = dq_settings.ACCEPT_DATA_LOSS_ON_EVICTION
    if not isinstance(accept, bool):
        out.append(
            Error(
                f"DELAYQUEUE[{ACCEPT!r}] must be True or False, not {accept!r}.",
                hint="Only True runs runqueue on a Redis that evicts keys; see docs/redis.md.",
                id="delayqueue.E011",
            )
        )
    percent = dq_settings.HEALTH_MAX_MEMORY_PERCENT
    if percent is not None and (
        isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 < percent <= 100
    ):
        out.append(
            Error(
                f"DELAYQUEUE['HEALTH_MAX_MEMORY_PERCENT'] must be a number above 0 and up to "
                f"100, or None, not {percent!r}.",
                hint="e.g. 90: the health probe fails once a server uses 90% of its maxmemory.",
                id="delayqueue.E011",
            )
        )
    for name in HEALTH_SECONDS:
        problem = seconds_setting_problem(name, optional=True)
        if problem:
            out.append(
                Error(
                    f"{problem}.",
                    hint="The readiness probe's thresholds (docs/monitoring.md); None turns "
                    "that check off.",
                    id="delayqueue.E011",
                )
            )
    lateness = dq_settings.HEALTH_LATENESS
    if not isinstance(lateness, bool):
        out.append(
            Error(
                f"DELAYQUEUE['HEALTH_LATENESS'] must be True or False, not {lateness!r}.",
                hint="True: the health probe fails for a queue whose p99 start lateness passes "
                "its lateness_warning_ms (see docs/observability.md).",
                id="delayqueue.E011",
            )
        )
    return out


def check_redis_servers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E010, W007 and W006: each server's eviction policy and persistence."""
    if server_setting_errors():
        return []  # E011 says what to fix first
    try:
        client = make_client(socket_connect_timeout=PING_TIMEOUT, socket_timeout=PING_TIMEOUT)
    except Exception:  # bad settings (E004), or a cluster that cannot be reached (E001)
        return []
    try:
        servers = app_servers(client)
    finally:
        if not dq_settings.CACHE_ALIAS:  # a borrowed cache connection is not ours to close
            client.close()
    out: list[CheckMessage] = []
    for f in findings(servers):
        kind = Error if f.kind == EVICTING else Warning
        out.append(kind(f.message, hint=f.hint, id=CHECK_IDS[f.kind]))
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
