"""Who may read ``metrics/`` and ``health/``: anyone, or with ``MONITORING_TOKEN`` set, whoever
sends it as a bearer token.

Both endpoints are open by default (scrapers and probes have no session), which suits a private
network. With a token set, a request must carry ``Authorization: Bearer <token>`` (Prometheus'
``authorization`` block sends it, a Kubernetes probe's ``httpHeaders`` too): ``metrics/``
answers 401 without it. ``health/`` still answers without it, with its status code and which
checks pass, but nothing more: the failing queues, Redis addresses and database aliases are
for those who send the token. A wrong token is a 401 on both (a probe sent with one would
otherwise pass or fail for the wrong reason).
"""

from __future__ import annotations

import hmac
from enum import Enum

from django.http import HttpRequest, HttpResponse

from django_delayqueue.conf.settings import dq_settings


class Access(Enum):
    OPEN = "open"  # no token set: everyone sees everything
    GRANTED = "granted"  # the token was sent
    ANONYMOUS = "anonymous"  # a token is set, none was sent
    REFUSED = "refused"  # a token is set, another one (or another scheme) was sent


def token() -> str | None:
    """``MONITORING_TOKEN``, or None when unset (a value that is not a non-empty string is the
    system check E016's to report, and reads as unset here: no page that cannot be opened)."""
    value = dq_settings.MONITORING_TOKEN
    return value if isinstance(value, str) and value else None


def access(request: HttpRequest) -> Access:
    """What ``request`` may see of the monitoring endpoints."""
    expected = token()
    if expected is None:
        return Access.OPEN
    header = request.headers.get("Authorization")
    if header is None:
        return Access.ANONYMOUS
    scheme, _, sent = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return Access.REFUSED
    # In constant time: the comparison must not tell how much of a guess was right.
    if hmac.compare_digest(sent.strip().encode(), expected.encode()):
        return Access.GRANTED
    return Access.REFUSED


def refused(what: str) -> HttpResponse:
    """401 with the challenge a client expects for a bearer token."""
    response = HttpResponse(
        f"{what} needs the MONITORING_TOKEN as a bearer token (Authorization: Bearer ...).\n",
        status=401,
        content_type="text/plain; charset=utf-8",
    )
    response["WWW-Authenticate"] = 'Bearer realm="delayqueue"'
    response["Cache-Control"] = "no-store"
    return response
