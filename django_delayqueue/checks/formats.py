"""E016 (``ENVELOPE_FORMAT``, part of check_settings) and W010: live consumers older than this
process, and messages that wait for a newer consumer (docs/upgrades.md).

W010 talks to Redis, so it runs with the deployment checks (``check --deploy``), as E001 does;
a Redis that does not answer is E001's to report. It reads the stats (monitoring.stats, the
admin's numbers): what each live consumer announced with its heartbeat, and what its queue's
consumers left for a newer one.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning

from django_delayqueue.checks.servers import PING_TIMEOUT
from django_delayqueue.conf.connection import make_client
from django_delayqueue.conf.settings import dq_settings, envelope_format_problem
from django_delayqueue.monitoring.stats import collect

UPGRADE_HINT = (
    "Upgrade those runqueues. Nothing is lost meanwhile: a consumer leaves a message whose "
    "envelope format it does not read for one that reads it (a runqueue of a release before "
    "envelope formats sends it to the dead letters instead, requeueable). See "
    "docs/upgrades.md of django-delayqueue."
)


def format_setting_errors() -> list[Error]:
    """E016: ``ENVELOPE_FORMAT`` that is not None or a format this release knows."""
    problem = envelope_format_problem(dq_settings.ENVELOPE_FORMAT)
    if problem is None:
        return []
    return [
        Error(
            f"{problem}.",
            hint="None (the default) reads and writes every format this release knows; an "
            "older one pins this process to an earlier release's (docs/upgrades.md).",
            id="delayqueue.E016",
        )
    ]


def check_envelope_formats(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W010: per queue, the live consumers older than this process and what waits for a
    newer consumer."""
    if format_setting_errors() or not _answers():
        return []
    out: list[CheckMessage] = []
    for stats in collect():
        formats = stats.formats
        if formats is None:
            continue
        said = [text for text in (formats.waiting_text(), formats.older_text()) if text]
        if said:
            out.append(
                Warning(
                    f"Queue {stats.queue!r}: {'; '.join(said)}.",
                    hint=UPGRADE_HINT,
                    id="delayqueue.W010",
                )
            )
    return out


def _answers() -> bool:
    """Whether Redis answers a PING soon (the stats would wait for the client's timeouts)."""
    try:
        client = make_client(socket_connect_timeout=PING_TIMEOUT, socket_timeout=PING_TIMEOUT)
    except Exception:  # bad settings (E004), or a cluster that cannot be reached (E001)
        return False
    try:
        return bool(client.ping())
    except Exception:  # E001's to report
        return False
    finally:
        if not dq_settings.CACHE_ALIAS:  # a borrowed cache connection is not ours to close
            client.close()
