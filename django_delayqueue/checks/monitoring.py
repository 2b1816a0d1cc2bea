"""E016: the settings of the monitoring endpoints (``metrics/`` and ``health/``): their bearer
token and the timeout of their Redis reads (part of check_settings)."""

from __future__ import annotations

import re

from django.core.checks import Error

from django_delayqueue.conf.settings import dq_settings, seconds_setting_problem

# What an HTTP header can carry of a bearer token as Prometheus and a Kubernetes probe send
# it (RFC 6750's token68, and the other printable characters but the space): a space or a
# control character could not be sent, and a token with one would lock every client out.
_TOKEN = re.compile(r"[\x21-\x7e]+")
SHORTEST_TOKEN = 16  # a token anyone can guess protects nothing
_HINT = (
    "e.g. \"MONITORING_TOKEN\": os.environ['DELAYQUEUE_MONITORING_TOKEN'] with a long random "
    "value (python -c 'import secrets; print(secrets.token_urlsafe(32))'), or None: the "
    "endpoints open to anyone who reaches them (docs/operations.md)."
)


def monitoring_errors() -> list[Error]:
    """E016: ``MONITORING_TOKEN`` and ``MONITORING_TIMEOUT_SECONDS``."""
    out: list[Error] = []
    value = dq_settings.MONITORING_TOKEN
    problem = None
    if value is None:
        pass
    elif not isinstance(value, str):
        problem = f"must be a string or None, not {type(value).__name__} {value!r}"
    elif not _TOKEN.fullmatch(value):
        problem = (
            "must be printable ASCII without spaces (what an Authorization header carries)"
            if value
            else "must not be empty (None: no token)"
        )
    elif len(value) < SHORTEST_TOKEN:
        problem = f"is {len(value)} characters long; use {SHORTEST_TOKEN} or more"
    if problem:
        # The value is not repeated: a check's output lands in logs and CI output.
        out.append(
            Error(f"DELAYQUEUE['MONITORING_TOKEN'] {problem}.", hint=_HINT, id="delayqueue.E018")
        )
    problem = seconds_setting_problem("MONITORING_TIMEOUT_SECONDS")
    if problem:
        out.append(
            Error(
                f"{problem}.",
                hint="How long metrics/ and health/ wait for Redis: below the scrape timeout "
                "and the probe's timeoutSeconds, e.g. 2.",
                id="delayqueue.E018",
            )
        )
    return out
