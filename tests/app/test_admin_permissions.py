"""Who may see the "Delay queues" admin pages and run each action (everyone else: nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from admin_support import OVERVIEW, QUEUE, action_url, bury, client_for, make_user, page, where

from django_delayqueue.core import Queue
from django_delayqueue.models import QueueConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def q(redis_client) -> Queue:
    return Queue(redis_client, QUEUE, prefix="dq")


VIEW = "django_delayqueue.view_queuemessage"
CHANGE = "django_delayqueue.change_queuemessage"
DELETE = "django_delayqueue.delete_queuemessage"
CONFIG = "django_delayqueue.change_queueconfig"

USERS: dict[str, dict[str, Any]] = {
    "anonymous": {},
    "non-staff": {"perms": (VIEW, CHANGE, DELETE, CONFIG), "staff": False},
    "staff, no permission": {"perms": ()},
    "staff, view": {"perms": (VIEW,)},
    "staff, change": {"perms": (CHANGE,)},  # change implies view, as in all of the admin
    "staff, view+delete": {"perms": (VIEW, DELETE)},
    "staff, delete only": {"perms": (DELETE,)},
    "staff, view+config": {"perms": (VIEW, CONFIG)},
    "superuser": {"perms": (), "su": True},
}
PAGES = {
    "anonymous": "login",
    "non-staff": "login",
    "staff, no permission": 403,
    "staff, delete only": 403,
}
# action -> users allowed to run it (everyone else: login redirect or 403, and no effect)
ALLOWED = {
    "run-now": {"staff, change", "superuser"},
    "cancel": {"staff, change", "superuser"},
    "requeue": {"staff, change", "superuser"},
    "purge": {"staff, view+delete", "superuser"},
    "pause": {"staff, view+config", "superuser"},
    "resume": {"staff, view+config", "superuser"},
}


def _user(django_user_model, label: str):
    spec = USERS[label]
    if not spec:
        return None
    name = label.replace(" ", "").replace(",", "-").replace("+", "-")
    return make_user(
        django_user_model,
        name,
        *spec["perms"],
        staff=spec.get("staff", True),
        su=spec.get("su", False),
    )


def _refused(response, label: str) -> bool:
    if USERS[label] and USERS[label].get("staff", True):
        return response.status_code == 403
    return response.status_code == 302 and response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("label", list(USERS))
def test_page_permissions(label, django_user_model, q):
    q.schedule({"secret": "payload-visible-only-to-viewers"}, delay=60)
    client = client_for(_user(django_user_model, label))
    for url in (OVERVIEW, page(), page(state="garbage")):
        response = client.get(url)
        expected = PAGES.get(label, 200)
        if expected == 200:
            assert response.status_code == 200, url
        else:
            assert _refused(response, label), (url, response.status_code)
            assert b"payload-visible-only-to-viewers" not in response.content


def _setup_for(action: str, q: Queue) -> Callable[[], bool]:
    """Prepare a message (or the queue) for ``action``; return a check that it took effect."""
    if action in ("run-now", "cancel"):
        q.schedule({"x": 1}, delay=600, id="target")
        after = "ready" if action == "run-now" else None
        return lambda: where(q, "target") == after
    if action in ("requeue", "purge"):
        bury(q, "target")
        after = "ready" if action == "requeue" else None
        return lambda: where(q, "target") == after
    if action == "resume":
        QueueConfig.objects.filter(name=QUEUE).update(paused=True)
    return lambda: QueueConfig.objects.get(name=QUEUE).paused is (action == "pause")


@pytest.mark.parametrize("action", list(ALLOWED))
@pytest.mark.parametrize("label", list(USERS))
def test_action_permissions(label, action, django_user_model, q):
    took_effect = _setup_for(action, q)
    client = client_for(_user(django_user_model, label))
    response = client.post(action_url(action), {"id": "target", "state": "pending"})
    if label in ALLOWED[action]:
        assert response.status_code == 302 and response["Location"].startswith(page())
        assert took_effect()
    else:
        assert _refused(response, label), response.status_code
        assert not took_effect()


@pytest.mark.parametrize("label", ["staff, view", "staff, view+delete", "staff, change"])
def test_buttons_follow_permissions(label, django_user_model, q):
    bury(q, "dead")
    client = client_for(_user(django_user_model, label))
    response = client.get(page(state="garbage"))
    offered = {a["action"] for a in response.context["row_actions"]}
    assert (
        offered
        == {
            "staff, view": set(),
            "staff, view+delete": {"purge"},
            "staff, change": {"requeue"},
        }[label]
    )
    assert response.context["pause_action"] is None
    assert response.context["settings_url"] is None
    html = response.content.decode()
    assert ('name="ids"' in html) is bool(offered)
