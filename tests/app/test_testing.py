"""django_delayqueue.testing: users' handler tests deliver through the real consumer."""

from __future__ import annotations

import pytest
import redis

import django_delayqueue as dq
from demo_project.shop.models import Order
from django_delayqueue.core import QueueKeys
from django_delayqueue.testing import deliver_due, deliver_now

pytestmark = pytest.mark.django_db(transaction=True)

ORDERS = QueueKeys("dq", "order-close")


def test_deliver_now_runs_a_message_due_in_half_an_hour(redis_client: redis.Redis) -> None:
    order = Order.objects.create(amount="3.00")
    dq.schedule("order-close", {"order_id": order.pk}, delay=1800, id=f"o-{order.pk}")
    deliver_due("order-close")
    order.refresh_from_db()
    assert order.status == Order.Status.OPEN  # not due yet: deliver_due leaves it waiting
    assert deliver_now("order-close", f"o-{order.pk}") == 1
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED
    assert redis_client.hlen(ORDERS.messages) == 0  # acknowledged


def test_deliver_due_delivers_what_is_due_on_every_queue(redis_client: redis.Redis) -> None:
    order = Order.objects.create(amount="3.00")
    dq.schedule("order-close", {"order_id": order.pk}, id=f"o-{order.pk}")
    deliver_due()
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED
