"""E008 and W004: the outbox's settings, and rows that no relay sent (django_delayqueue.outbox)."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning

from django_delayqueue.checks.hints import CONFIGURATION_HINT
from django_delayqueue.conf.settings import dq_settings, seconds_setting_problem

OUTBOX_SECONDS = ("OUTBOX_RELAY_SECONDS", "OUTBOX_LEASE_SECONDS", "OUTBOX_MAX_AGE_SECONDS")


def outbox_errors() -> list[Any]:
    """E008: the outbox switch and its timings."""
    out = []
    if not isinstance(dq_settings.OUTBOX, bool):
        out.append(
            Error(
                f"DELAYQUEUE['OUTBOX'] must be True or False, not {dq_settings.OUTBOX!r}.",
                hint=CONFIGURATION_HINT,
                id="delayqueue.E008",
            )
        )
    for name in OUTBOX_SECONDS:
        problem = seconds_setting_problem(name)
        if problem:
            out.append(Error(f"{problem}.", hint=CONFIGURATION_HINT, id="delayqueue.E008"))
    return out


def check_outbox(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """W004: outbox rows that have waited longer than OUTBOX_MAX_AGE_SECONDS."""
    if not databases or outbox_errors():
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
