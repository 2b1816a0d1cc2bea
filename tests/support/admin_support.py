"""Helpers for the admin tests: URLs, users with given permissions, messages in given states."""

from __future__ import annotations

from django.contrib.auth.models import Permission
from django.test import Client

from django_delayqueue.core import Queue

OVERVIEW = "/admin/django_delayqueue/queuemessage/"
QUEUE = "order-close"


def page(queue: str = QUEUE, state: str | None = None, p: int | None = None) -> str:
    url = f"{OVERVIEW}{queue}/"
    query = "&".join(f"{k}={v}" for k, v in (("state", state), ("p", p)) if v is not None)
    return f"{url}?{query}" if query else url


def action_url(action: str, queue: str = QUEUE) -> str:
    return f"{OVERVIEW}{queue}/{action}/"


def bury(q: Queue, *ids: str, reason: str = "poison") -> None:
    """Put messages ``ids`` straight into garbage (schedule due now, claim, bury)."""
    for message_id in ids:
        q.schedule({"id": message_id}, id=message_id)
    for message in q.claim(len(ids)):
        assert q.bury(message, reason)


def where(q: Queue, message_id: str) -> str | None:
    """The state a message is in (None: gone)."""
    for state in ("pending", "unack", "retry", "garbage"):
        if q.client.zscore(getattr(q.keys, state), message_id) is not None:
            return state
    if message_id.encode() in q.client.lrange(q.keys.ready, 0, -1):
        return "ready"
    return None


def make_user(django_user_model, name: str, *perms: str, staff: bool = True, su: bool = False):
    user = django_user_model.objects.create_user(
        name, f"{name}@example.com", "pw", is_staff=staff, is_superuser=su
    )
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    return user


def client_for(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client
