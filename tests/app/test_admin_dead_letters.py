"""The queue page's dead letters by reason: a group per reason with its count, each one click
from "requeue all" (or "purge all") of that reason, after the confirmation the other "all"
actions ask for."""

from __future__ import annotations

from typing import Any

import pytest
from admin_support import QUEUE, action_url, bury, client_for, make_user, page, where

from django_delayqueue.core import Queue

pytestmark = pytest.mark.django_db

OUTAGE = "no attempts left (3 of 3): PartnerDown: 503 Service Unavailable"
REFUSED = "422 from the partner: amounts above 90.00 need a manual review"


@pytest.fixture
def q(redis_client: Any) -> Queue:
    q = Queue(redis_client, QUEUE, prefix="dq")
    bury(q, "down-1", "down-2", "down-3", reason=OUTAGE)
    bury(q, "refused-1", reason=REFUSED)
    return q


def by_reason(reason: str, **extra: str) -> dict[str, str]:
    return {"all": "1", "by_reason": "1", "reason": reason, "state": "garbage", **extra}


def test_the_dead_letters_tab_groups_them_by_reason_with_counts(admin_client: Any, q: Queue):
    response = admin_client.get(page(state="garbage"))
    groups = response.context["reasons"]["groups"]
    assert [(g["reason"], g["count"]) for g in groups] == [(OUTAGE, 3), (REFUSED, 1)]
    html = response.content.decode()
    table = html.split('id="dq-reasons"', 1)[1].split("</table>", 1)[0]
    assert "Requeue all 3" in table and "Purge all 1" in table
    assert admin_client.get(page(state="pending")).context["reasons"] is None  # that tab only


def test_requeue_all_of_one_reason_asks_then_requeues_only_those(admin_client: Any, q: Queue):
    confirm = admin_client.post(action_url("requeue"), by_reason(OUTAGE))
    assert confirm.status_code == 200 and confirm.context["count"] == 3
    html = confirm.content.decode()
    assert "that died of" in html and OUTAGE in html
    assert where(q, "down-1") == "garbage"  # nothing yet
    done = admin_client.post(action_url("requeue"), by_reason(OUTAGE, confirm="yes"), follow=True)
    assert "Requeued 3 message(s) to ready." in done.content.decode()
    assert [where(q, i) for i in ("down-1", "down-2", "down-3")] == ["ready"] * 3
    assert where(q, "refused-1") == "garbage"  # another reason: left alone
    assert q.counts()["garbage"] == 1


def test_purge_all_of_one_reason(admin_client: Any, q: Queue):
    admin_client.post(action_url("purge"), by_reason(REFUSED, confirm="yes"))
    assert where(q, "refused-1") is None and q.counts()["garbage"] == 3


def test_each_group_offers_only_what_the_user_may_do(django_user_model: Any, q: Queue):
    clerk = make_user(
        django_user_model,
        "clerk",
        "django_delayqueue.view_queuemessage",
        "django_delayqueue.change_queuemessage",
    )
    client = client_for(clerk)
    table = client.get(page(state="garbage")).content.decode().split('id="dq-reasons"', 1)[1]
    assert "Requeue all 3" in table and "Purge all" not in table.split("</table>", 1)[0]
    refused = client.post(action_url("purge"), by_reason(REFUSED, confirm="yes"))
    assert refused.status_code == 403 and where(q, "refused-1") == "garbage"
    viewer = make_user(django_user_model, "viewer", "django_delayqueue.view_queuemessage")
    html = client_for(viewer).get(page(state="garbage")).content.decode()
    assert "Requeue all" not in html.split('id="dq-reasons"', 1)[1].split("</table>", 1)[0]
