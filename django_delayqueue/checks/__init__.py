"""System checks (``manage.py check``): bad configuration is reported here, with a hint.

==================  ================================================================
delayqueue.E001     Redis unreachable (``check --deploy [--tag delayqueue]``)
delayqueue.E002     unknown key in ``DELAYQUEUE``, its ``DEFAULTS`` or a queue
delayqueue.E003     invalid per-queue settings values (``lateness_warning_ms`` included)
delayqueue.E004     invalid connection settings (URL, cache alias, clock, prefix, names),
                    or a ``SETTINGS_REFRESH_SECONDS`` that is not a finite number >= 0
delayqueue.E005     invalid ``RESULT_TTL`` of a ``TASKS`` backend of this app
delayqueue.E006     ``ON_COMMIT`` of a ``TASKS`` backend without any database
delayqueue.E007     a ``TASKS`` backend's queue name that is not a valid queue name
delayqueue.E008     invalid outbox settings (``OUTBOX``, ``OUTBOX_*_SECONDS``)
delayqueue.E009     a recurring schedule in ``SCHEDULES`` that is invalid, has no queue, or
                    puts a task where no backend runs it (or a payload where only tasks run)
delayqueue.E010     a Redis whose ``maxmemory-policy`` evicts keys (``check --deploy``)
delayqueue.E011     invalid ``ACCEPT_DATA_LOSS_ON_EVICTION``, ``HEALTH_MAX_MEMORY_PERCENT``,
                    ``HEALTH_LATENESS`` or ``HEALTH_*_SECONDS``
delayqueue.E012     ``django_delayqueue`` missing from INSTALLED_APPS (a TASKS backend's check)
delayqueue.E013     a queue's ``time_limit`` not above its ``soft_time_limit``
delayqueue.E014     a queue's ``visibility_timeout`` that cannot cover its ``time_limit``
delayqueue.E015     a queue's ``rate_limit`` or ``max_in_flight`` that cannot be read, or
                    cannot be split between the queue's shards
delayqueue.E016     ``ENVELOPE_FORMAT`` that is not None or a format this release knows
delayqueue.E017     invalid ``OPTIONS`` of a ``TASKS`` backend of this app
delayqueue.E018     invalid ``MONITORING_TOKEN`` (not a string, empty, with a space, short)
                    or ``MONITORING_TIMEOUT_SECONDS``
delayqueue.E019     an atomic queue (``"atomic"``) whose value is not True, False or an alias
                    in ``DATABASES``, on a database without transactions or where the
                    routers keep the inbox table away (docs/exactly-once.md)
delayqueue.W005     the problems of E009 in a recurring schedule row (``--database``)
delayqueue.W001     a configured queue has no handler (queues of a TASKS backend need none)
delayqueue.W002     (retired: E014 says it, now that time limits are enforced)
delayqueue.W003     handlers registered for a queue that is not configured
delayqueue.W004     outbox messages older than ``OUTBOX_MAX_AGE_SECONDS``: no relay sent
                    them (``check --database default``, and ``migrate``)
delayqueue.W006     a Redis without AOF or RDB snapshots (``check --deploy``; not the
                    embedded one of the demo and the tests)
delayqueue.W007     E010 accepted by ``ACCEPT_DATA_LOSS_ON_EVICTION`` (``check --deploy``)
delayqueue.W008     a deprecated queue setting (``handler_time_limit``, read as ``time_limit``)
delayqueue.W009     E014 for a queue that sets only the deprecated ``handler_time_limit``
delayqueue.W010     live consumers older than this process (an older envelope format), or
                    messages that wait for a newer consumer (``check --deploy``)
delayqueue.W011     a sharded queue with ``rate_limit`` or ``max_in_flight`` that takes flow
                    keys: a key gets one shard's share of them (figures in the message)
delayqueue.W012     an atomic queue's database without the inbox table (``check --database``,
                    ``migrate``; runqueue refuses to start for it)
==================  ================================================================

Only E001, E010, W006, W007, W010 and W004 do I/O: the first five (``servers``, ``formats``)
run with the deployment checks (and on demand), W004 with the database checks: a Redis that is
down must not stop ``migrate`` or ``runqueue``, which waits for it (and judges the servers
itself once they answer: monitoring.servers.ServerGuard). E005-E007 and E012 are the Tasks
backend's own ``check()``: run by the framework's check once the framework is imported (and,
for the backport, in INSTALLED_APPS), and by ``check_task_backends`` here when it is not.

One module an area, as Django's ``core/checks/`` is: ``settings`` (the ``DELAYQUEUE`` dict:
E002, E004, gathering the settings errors of the others), ``queues`` (E002-E004, E013, E014,
W008 of a queue; W001, W003), ``flow`` (E015, W011 of a queue), ``servers`` (E001, E010, E011,
W006, W007), ``tasks`` (E005-E007, E012), ``recurrences`` (E009, W005), ``outbox`` (E008, W004),
``formats`` (E016, W010), ``monitoring`` (E018) and ``atomic`` (E019, W012).
"""

from __future__ import annotations

from django.core.checks import Tags, register

from django_delayqueue.checks.atomic import check_atomic, check_atomic_tables
from django_delayqueue.checks.formats import check_envelope_formats
from django_delayqueue.checks.outbox import check_outbox
from django_delayqueue.checks.queues import check_handlers
from django_delayqueue.checks.recurrences import check_schedule_rows, check_schedules
from django_delayqueue.checks.servers import check_redis, check_redis_servers
from django_delayqueue.checks.settings import check_settings
from django_delayqueue.checks.tasks import check_task_backends

TAG = "delayqueue"

__all__ = [
    "TAG",
    "check_atomic",
    "check_atomic_tables",
    "check_envelope_formats",
    "check_handlers",
    "check_outbox",
    "check_redis",
    "check_redis_servers",
    "check_schedule_rows",
    "check_schedules",
    "check_settings",
    "check_task_backends",
    "register_checks",
]


def register_checks() -> None:
    register(check_settings, TAG)
    register(check_handlers, TAG)
    register(check_redis, TAG, deploy=True)
    register(check_redis_servers, TAG, deploy=True)
    register(check_envelope_formats, TAG, deploy=True)
    register(check_task_backends, TAG)
    register(check_schedules, TAG)
    register(check_schedule_rows, Tags.database)
    # Only with the database checks (`check --database`, `migrate`): not with `--tag delayqueue`,
    # which must not query a database nobody asked for.
    register(check_outbox, Tags.database)
    register(check_atomic, TAG)
    register(check_atomic_tables, Tags.database)
