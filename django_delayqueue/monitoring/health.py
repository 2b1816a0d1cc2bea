"""A readiness probe: Redis reachable, consumers alive, nothing overdue beyond a threshold,
no outbox message waiting too long.

``GET <mount>/health/`` answers 200 with a JSON report when every check passes, 503 with the
same report naming the failing checks otherwise. Settings (``DELAYQUEUE``):

- ``HEALTH_MAX_OVERDUE_SECONDS`` (60): a running queue whose oldest due message has waited
  longer fails the ``overdue`` check. ``None`` turns the check off.
- ``HEALTH_CONSUMER_SECONDS`` (30): a running queue with no consumer heartbeat this recent
  fails the ``consumers`` check. ``None`` turns the check off (say, for the web pods' probe,
  which should not fail when the workers do).

A queue whose consumer processes keep dying before they consume (their supervisor says so:
monitoring.start_failures) fails the ``starting`` check, with the error they die of.

- ``OUTBOX_MAX_AGE_SECONDS`` (60): an outbox message (committed while Redis was down) that has
  waited longer for a relay fails the ``outbox`` check, and so does a database that cannot be
  read, or the outbox table missing from every database (``migrate`` not run).
- ``HEALTH_MAX_MEMORY_PERCENT`` (None: off): a Redis server that uses this share of its
  ``maxmemory`` or more (or is full) fails the ``memory`` check.
- ``HEALTH_LATENESS`` (False: off): when True, a running queue whose p99 start lateness over
  the last 5 minutes passes its ``lateness_warning_ms`` fails the ``lateness`` check (the
  queues without that setting are never checked). Off, the report still shows each queue's
  lateness.

The ``envelope_formats`` check (docs/upgrades.md) names the live consumers older than this
process (they read an older envelope format than it may write: ``older_consumers``), and fails
for a queue whose messages wait for a newer consumer while no live consumer reads their format
(they wait until one is upgraded; a consumer that reads it delivers them within a minute).

A Redis server whose ``maxmemory-policy`` evicts keys fails the ``eviction`` check, unless
``ACCEPT_DATA_LOSS_ON_EVICTION`` (see monitoring.servers), and so does one whose INFO cannot be
read (its policy is not known); ``servers`` in the report has each server's memory, policy and
persistence.

Paused queues are expected to have a backlog and may have no consumer: they are not checked.

A probe may ask for some checks only (``?check=redis``). One that names a check the settings
turn off (``?check=memory`` without ``HEALTH_MAX_MEMORY_PERCENT``) gets a 400 naming the
setting that turns it on, as one naming a check that does not exist: it would otherwise pass
with nothing checked.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

from django_delayqueue.conf.connection import monitoring_reads
from django_delayqueue.conf.queues import queue_settings
from django_delayqueue.conf.settings import dq_settings, envelope_format
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.server_info import ServerInfo
from django_delayqueue.monitoring.access import Access, access, refused
from django_delayqueue.monitoring.processes import past_limit, supervisors_dict
from django_delayqueue.monitoring.servers import (
    app_servers,
    eviction_accepted,
    findings,
    memory_problems,
)
from django_delayqueue.monitoring.stats import (
    DEFAULT_ALIVE_SECONDS,
    QueueStats,
    collect,
    format_seconds,
    redis_unreachable,
    setting,
)

DEFAULT_MAX_OVERDUE_SECONDS = 60.0


# Every check, in the order of the report. A probe may ask for some only (``?check=redis``).
CHECKS = (
    "redis",
    "consumers",
    "starting",
    "overdue",
    "lateness",
    "envelope_formats",
    "outbox",
    "eviction",
    "memory",
)
# The checks that read no queue: a probe asking for these alone costs one PING.
_WITHOUT_STATS = frozenset({"redis", "outbox"})


def check_health(
    stats: list[QueueStats] | None = None, only: Collection[str] | None = None
) -> tuple[bool, dict[str, Any]]:
    """Run the checks on ``stats`` (default: :func:`collect` now); ``(healthy, report)``.

    ``only``: the names of the checks to run (default: all of :data:`CHECKS`); the report
    then has those alone. Redis is asked a PING first: when it does not answer, nothing else
    is asked of it (each read would wait out its timeout again) and the checks that read it
    are not run, so the report says Redis is down, not that no consumer had a heartbeat.
    """
    wanted = set(CHECKS) if only is None else set(only)
    max_overdue = setting("HEALTH_MAX_OVERDUE_SECONDS", DEFAULT_MAX_OVERDUE_SECONDS)
    consumer_seconds = setting("HEALTH_CONSUMER_SECONDS", DEFAULT_ALIVE_SECONDS)
    down: list[str] = []
    if stats is None:
        down = redis_unreachable()
        all_stats = [] if down or wanted <= _WITHOUT_STATS else collect()
    else:
        all_stats = stats
        if not all_stats:
            down = redis_unreachable()
    redis_errors = down or sorted({e for s in all_stats for e in s.errors})
    checks: dict[str, dict[str, Any]] = {
        "redis": {"ok": not redis_errors, **({"errors": redis_errors} if redis_errors else {})}
    }
    running = [s for s in all_stats if not s.paused]
    if consumer_seconds is not None and not down:
        failing = {
            s.queue: f"no consumer heartbeat in the last {format_seconds(consumer_seconds)}"
            for s in running
            if s.consumers_alive == 0  # None: not read, which the redis check says
        }
        checks["consumers"] = _check(failing, within_seconds=consumer_seconds)
    # Paused or not: a queue whose consumers cannot start is not consumed once resumed either.
    if not down:
        dying = {s.queue: "; ".join(s.start_failures) for s in all_stats if s.start_failures}
        checks["starting"] = _check(dying)
    if max_overdue is not None and not down:
        failing = {
            s.queue: f"oldest due message waiting {format_seconds(s.oldest_overdue_seconds)}"
            for s in running
            if s.oldest_overdue_seconds is not None and s.oldest_overdue_seconds > max_overdue
        }
        checks["overdue"] = _check(failing, max_seconds=max_overdue)
    if dq_settings.HEALTH_LATENESS is True and not down:
        failing = {
            s.queue: f"p99 start lateness over 5 min {s.lateness.p99_5m:.1f} ms > "
            f"{s.lateness.warning_ms:g} ms"
            for s in running
            if s.lateness is not None and s.lateness.flagged
        }
        checks["lateness"] = _check(failing)
    if not down:
        checks["envelope_formats"] = _formats_check(all_stats, running)
    outbox = _outbox_report(asked=only is not None) if "outbox" in wanted else {}
    if outbox:
        checks["outbox"] = outbox
    # Not asked again when the stats could not be read: the probe must answer fast.
    servers = [] if redis_errors or wanted <= _WITHOUT_STATS else app_servers()
    if not down:
        checks.update(_server_checks(servers))
    # Redis down fails every check that reads it: kept in a report that asked for those only.
    needs_redis = bool(wanted - {"outbox"})
    checks = {
        name: check
        for name, check in checks.items()
        if name in wanted or (name == "redis" and needs_redis and not check["ok"])
    }
    healthy = all(c["ok"] for c in checks.values())
    report = {
        "status": "ok" if healthy else "fail",
        "checks": checks,
        "queues": {
            s.queue: {
                "paused": s.paused,
                "consumers_alive": s.consumers_alive,
                "supervisors": supervisors_dict(s.processes),
                "stalled": stalled_count(s),
                "start_failures": s.start_failures,
                "oldest_overdue_seconds": s.oldest_overdue_seconds,
                "overdue_messages": s.overdue_messages,
                "counts": s.counts,
                "lateness": s.lateness.to_dict() if s.lateness is not None else None,
                "envelope_formats": None if s.formats is None else s.formats.to_dict(),
            }
            for s in all_stats
        },
        "servers": [s.to_dict() for s in servers],
    }
    return healthy, report


def _formats_check(all_stats: list[QueueStats], running: list[QueueStats]) -> dict[str, Any]:
    """Fails for a running queue whose messages wait for a newer consumer that is not alive;
    names the live consumers older than this process either way."""
    failing = {
        s.queue: s.formats.waiting_text()
        for s in running
        if s.formats is not None and s.formats.stuck
    }
    older = {s.queue: s.formats.older for s in all_stats if s.formats and s.formats.older}
    return {**_check(failing, format=envelope_format()), "older_consumers": older}


def stalled_count(s: QueueStats) -> int | None:
    """How many of the queue's running messages run past its ``time_limit`` (None: unknown)."""
    try:
        limit = queue_settings(s.queue).time_limit
    except ConfigurationError:
        return None
    return len(past_limit(s.running, limit, s.now_ms))


def queue_time_limit(name: str) -> float | None:
    """The queue's ``time_limit`` (None: none, or its settings cannot be read)."""
    try:
        return queue_settings(name).time_limit
    except ConfigurationError:
        return None


def _server_checks(servers: list[ServerInfo]) -> dict[str, dict[str, Any]]:
    """``eviction`` (a policy that deletes messages, not accepted) and, when asked for with
    ``HEALTH_MAX_MEMORY_PERCENT``, ``memory``.

    A server whose INFO cannot be read (an ACL denying it, say) fails ``eviction``: its policy
    is not known, and a probe asking for that check alone would otherwise pass with nothing
    checked. Unless the data loss is accepted, when the policy does not matter."""
    out: dict[str, dict[str, Any]] = {}
    if servers:
        failing = {f.server: f.message for f in findings(servers) if f.refuses_runqueue}
        if not eviction_accepted():
            for s in servers:
                if not s.ok:
                    failing[s.address] = (
                        f"could not read the server's INFO ({s.error}): its maxmemory-policy "
                        "is not known"
                    )
        out["eviction"] = _check(failing)
    percent = setting("HEALTH_MAX_MEMORY_PERCENT", None)
    if percent is not None:
        out["memory"] = _check(memory_problems(servers, percent), max_percent=percent)
    return out


def _outbox_report(asked: bool) -> dict[str, Any]:
    """The outbox backlog of each database; a database that cannot be read fails the check,
    and so do the databases that may hold the outbox when none has its table (migrations not
    run: a commit while Redis is down would have nowhere to go). A project without such a
    database is left out of the full report; ``asked`` (the check named), it fails: a probe of
    it alone must not pass with nothing checked."""
    from django_delayqueue.models import OutboxMessage
    from django_delayqueue.outbox.backlog import read_backlogs
    from django_delayqueue.outbox.relay import outbox_databases

    limit = setting("OUTBOX_MAX_AGE_SECONDS", 60.0)
    aliases = outbox_databases()
    backlogs, unreadable = read_backlogs(aliases)
    if not backlogs and not unreadable:
        if not aliases and not asked:
            return {}
        table = OutboxMessage._meta.db_table
        missing = {
            alias: f"the outbox table {table!r} is missing: run migrate" for alias in aliases
        }
        if not aliases:
            missing["(none)"] = (
                "no database may hold the outbox table (DATABASES, DATABASE_ROUTERS)"
            )
        return {**_check(missing), "databases": {}}
    databases = {
        b.database: {"waiting": b.count, "oldest_seconds": round(b.age_seconds(), 3)}
        for b in backlogs
    }
    failing = {
        name: f"an outbox message has waited {format_seconds(info['oldest_seconds'])}"
        for name, info in databases.items()
        if limit is not None and info["oldest_seconds"] > limit
    }
    failing.update({name: f"could not read the outbox: {e}" for name, e in unreadable.items()})
    limits = {} if limit is None else {"max_seconds": limit}
    return {**_check(failing, **limits), "databases": databases}


def _check(failing: dict[str, str], **limits: float) -> dict[str, Any]:
    return {"ok": not failing, **limits, **({"failing": failing} if failing else {})}


@require_safe
def health_view(request: HttpRequest) -> HttpResponse:
    """200 and ``{"status": "ok", ...}`` when healthy, 503 and the failing checks otherwise.

    ``?check=redis`` (repeated, or comma-separated) runs those checks alone: a web pod's
    readiness asks for ``redis``, so that workers stopping do not take the site down. A
    check that does not exist, or that the settings turn off, is a 400 saying so. With
    ``MONITORING_TOKEN`` set, a request without it gets the status and which checks pass,
    nothing more (monitoring.access)."""
    allowed = access(request)
    if allowed is Access.REFUSED:
        return refused("health/")
    try:
        only = asked_checks(request.GET.getlist("check"))
    except ValueError as e:
        return JsonResponse({"error": str(e)}, status=400)
    with monitoring_reads():
        healthy, report = check_health(only=only)
    if allowed is Access.ANONYMOUS:
        checks = {name: {"ok": c["ok"]} for name, c in report["checks"].items()}
        report = {"status": report["status"], "checks": checks}
    response = JsonResponse(report, status=200 if healthy else 503)
    response["Cache-Control"] = "no-store"
    return response


def asked_checks(values: list[str]) -> set[str] | None:
    """The checks a request names in its ``check`` parameters (None: none named, all of
    them); ValueError naming one that does not exist, or one that is turned off (with the
    setting that turns it on): a probe that asked for it alone would pass without anything
    checked."""
    names = {n.strip() for value in values for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(CHECKS))
    if unknown:
        raise ValueError(
            f"unknown check {', '.join(map(repr, unknown))}; known: {', '.join(CHECKS)}"
        )
    off = switched_off()
    asked_off = [name for name in CHECKS if name in names and name in off]
    if asked_off:
        said = [f"check {name!r} is turned off: {off[name]} to turn it on" for name in asked_off]
        raise ValueError("; ".join(said))
    return names or None


def switched_off() -> dict[str, str]:
    """The checks the settings turn off, each with what turns it on."""
    off = {}
    if setting("HEALTH_CONSUMER_SECONDS", DEFAULT_ALIVE_SECONDS) is None:
        off["consumers"] = "set DELAYQUEUE['HEALTH_CONSUMER_SECONDS'] to a number of seconds"
    if setting("HEALTH_MAX_OVERDUE_SECONDS", DEFAULT_MAX_OVERDUE_SECONDS) is None:
        off["overdue"] = "set DELAYQUEUE['HEALTH_MAX_OVERDUE_SECONDS'] to a number of seconds"
    if dq_settings.HEALTH_LATENESS is not True:
        off["lateness"] = "set DELAYQUEUE['HEALTH_LATENESS'] = True"
    if setting("HEALTH_MAX_MEMORY_PERCENT", None) is None:
        off["memory"] = "set DELAYQUEUE['HEALTH_MAX_MEMORY_PERCENT'] to a percentage (e.g. 90)"
    return off
