"""The chain of docs/exactly-once.md runs as written: an order placed, a reminder after a day,
the order closed after a week, each step on an atomic queue scheduling the next through the
outbox. The code is read from the page, so the page cannot drift from what works."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import override_settings

import django_delayqueue as dq
from demo_project.shop.models import Order, SentSms
from django_delayqueue.conf.queues import get_queue
from django_delayqueue.models import InboxEntry, OutboxMessage
from django_delayqueue.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "exactly-once.md"
QUEUES = ("order-placed", "order-remind", "order-expire")


def example_code() -> str:
    text = PAGE.read_text()
    found = re.search(r"<!-- exactly-once-example -->\n```python\n(.*?)\n```", text, re.S)
    assert found, "docs/exactly-once.md lost its example"
    return found.group(1)


@pytest.fixture
def chain(redis_client: redis.Redis) -> Iterator[dict[str, Any]]:
    queues = {**settings.DELAYQUEUE["QUEUES"], **{q: {"atomic": True} for q in QUEUES}}
    namespace: dict[str, Any] = {}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        exec(compile(example_code(), str(PAGE), "exec"), namespace)  # connects its receivers
        try:
            yield namespace
        finally:
            for name in QUEUES:
                for func in ("order_placed", "order_remind", "order_expire"):
                    dq.topic(name).disconnect(namespace[func])


def deliver() -> None:
    Worker.for_queues(list(QUEUES), burst=True).run()


def test_the_documented_chain_runs_each_step_once(chain: dict[str, Any]) -> None:
    with transaction.atomic():  # the view's transaction
        order = Order.objects.create(amount=10)
        dq.schedule("order-placed", {"order": order.pk})
    deliver()
    assert list(SentSms.objects.values_list("kind", flat=True)) == ["placed"]
    remind = get_queue("order-remind")
    assert remind.run_now(f"remind-{order.pk}") == 1  # a day later
    deliver()
    assert sorted(SentSms.objects.values_list("kind", flat=True)) == ["placed", "remind"]
    assert get_queue("order-expire").run_now(f"expire-{order.pk}") == 1  # six days after that
    deliver()
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED
    assert SentSms.objects.count() == 2
    assert InboxEntry.objects.count() == 3 and not OutboxMessage.objects.exists()
