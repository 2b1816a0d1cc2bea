"""The demo shop end to end: a view schedules, ``runqueue --burst`` delivers, the DB shows it."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse

import django_delayqueue as dq
from demo_project.shop import handlers
from demo_project.shop.models import Order, Product, SentSms, Store
from demo_project.shop.sms import DatabaseBackend, get_backend
from django_delayqueue.core import QueueKeys

ORDERS = QueueKeys("dq", "order-close")
SMS = QueueKeys("dq", "activation-sms")

pytestmark = pytest.mark.django_db(transaction=True)


def deliver() -> None:
    call_command("runqueue", "--burst", "--verbosity", "0")


@pytest.fixture
def client() -> Client:
    return Client(enforce_csrf_checks=True)


def post(client: Client, url: str, data: dict[str, Any] | None = None) -> Any:
    """POST with the CSRF token, as the page's form would."""
    client.get(reverse("shop:index"))
    token = client.cookies["csrftoken"].value
    return client.post(url, {**(data or {}), "csrfmiddlewaretoken": token})


# --- orders ---------------------------------------------------------------------------------


@override_settings(ORDER_CLOSE_DELAY=0)
def test_an_unpaid_order_is_closed(client: Client, redis_client: redis.Redis) -> None:
    response = post(client, reverse("shop:create_order"), {"amount": "12.50"})
    assert response.status_code == 302
    order = Order.objects.get()
    assert (order.amount, order.status) == (Decimal("12.50"), Order.Status.OPEN)
    assert redis_client.hexists(ORDERS.messages, f"order-{order.pk}")
    deliver()
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED
    assert redis_client.hlen(ORDERS.messages) == 0  # acknowledged


def test_the_close_is_scheduled_after_the_configured_delay(
    client: Client, redis_client: redis.Redis
) -> None:
    post(client, reverse("shop:create_order"), {"amount": "1"})
    order = Order.objects.get()
    due = redis_client.zscore(ORDERS.pending, f"order-{order.pk}")
    seconds, micros = redis_client.time()
    assert due is not None and due - (seconds * 1000 + micros // 1000) > 25_000  # ~30 s
    deliver()  # not due yet: nothing happens
    order.refresh_from_db()
    assert order.status == Order.Status.OPEN


def test_paying_cancels_the_close(client: Client, redis_client: redis.Redis) -> None:
    post(client, reverse("shop:create_order"), {"amount": "5"})
    order = Order.objects.get()
    response = post(client, reverse("shop:pay_order", args=[order.pk]))
    assert response.status_code == 302
    order.refresh_from_db()
    assert order.status == Order.Status.PAID
    assert redis_client.zcard(ORDERS.pending) == 0
    assert redis_client.hlen(ORDERS.messages) == 0


@override_settings(ORDER_CLOSE_DELAY=0)
def test_a_closed_order_cannot_be_paid(client: Client, redis_client: redis.Redis) -> None:
    post(client, reverse("shop:create_order"), {"amount": "5"})
    deliver()
    order = Order.objects.get()
    post(client, reverse("shop:pay_order", args=[order.pk]))
    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED


def test_a_late_delivery_does_not_close_a_paid_order(redis_client: redis.Redis) -> None:
    order = Order.objects.create(amount=3, status=Order.Status.PAID)
    dq.schedule("order-close", {"order_id": order.pk}, on_commit=False)
    deliver()
    order.refresh_from_db()
    assert order.status == Order.Status.PAID


def test_a_rolled_back_order_schedules_nothing(redis_client: redis.Redis) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(amount=1)
        dq.schedule("order-close", {"order_id": order.pk}, id=f"order-{order.pk}")
        raise RuntimeError("payment provider said no")
    assert not Order.objects.exists()
    assert redis_client.hlen(ORDERS.messages) == 0


@pytest.mark.parametrize("amount", ["lots", "nan", "inf", "1e30"])
def test_a_bad_amount_is_refused(client: Client, redis_client: redis.Redis, amount: str) -> None:
    response = post(client, reverse("shop:create_order"), {"amount": amount})
    assert response.status_code == 400
    assert not Order.objects.exists()
    assert redis_client.hlen(ORDERS.messages) == 0


def test_forms_need_csrf(client: Client, redis_client: redis.Redis) -> None:
    assert client.post(reverse("shop:create_order"), {"amount": "1"}).status_code == 403
    assert client.get(reverse("shop:create_order")).status_code == 405


# --- stores ---------------------------------------------------------------------------------


@override_settings(ACTIVATION_SMS_DELAY=0)
def test_a_store_without_products_gets_the_activation_sms(
    client: Client, redis_client: redis.Redis
) -> None:
    post(client, reverse("shop:create_store"), {"name": "Kiosk", "phone": "+15550101"})
    store = Store.objects.get()
    deliver()
    sms = SentSms.objects.get()
    assert (sms.phone, sms.kind, sms.store) == ("+15550101", "activation", store)
    assert "Kiosk" in sms.text
    assert redis_client.hlen(SMS.flow_keys) == 0  # its key (the phone) went with the ack
    page = client.get(reverse("shop:sent_sms"))
    assert page.status_code == 200 and b"+15550101" in page.content


@override_settings(ACTIVATION_SMS_DELAY=0)
def test_a_store_with_a_product_gets_no_sms(client: Client, redis_client: redis.Redis) -> None:
    with transaction.atomic():  # the product arrives before the message is delivered
        post(client, reverse("shop:create_store"), {"name": "Busy", "phone": "+15550102"})
        store = Store.objects.get()
        post(client, reverse("shop:add_product", args=[store.pk]), {"name": "Tea"})
    assert Product.objects.get().store == store
    deliver()
    assert not SentSms.objects.exists()
    assert redis_client.hlen(SMS.messages) == 0  # acknowledged all the same


def test_the_activation_sms_is_sent_once_even_if_delivered_twice(
    redis_client: redis.Redis,
) -> None:
    store = Store.objects.create(name="Twice", phone="+15550103")
    for _ in range(2):  # at-least-once: a redelivery after a lost ack
        dq.schedule("activation-sms", {"store_id": store.pk}, on_commit=False)
        deliver()
    assert SentSms.objects.count() == 1


def test_the_sms_backend_is_a_setting(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    assert isinstance(get_backend(), DatabaseBackend)
    store = Store.objects.create(name="Quiet", phone="+15550104")
    dq.schedule("activation-sms", {"store_id": store.pk}, on_commit=False)
    backend = "demo_project.shop.sms.LoggingBackend"
    with override_settings(SHOP_SMS_BACKEND=backend), caplog.at_level(logging.INFO):
        deliver()
    assert not SentSms.objects.exists()
    assert any("SMS to +15550104" in r.getMessage() for r in caplog.records)


# --- pages and wiring -----------------------------------------------------------------------


def test_index_lists_orders_and_stores(client: Client, redis_client: redis.Redis) -> None:
    post(client, reverse("shop:create_order"), {"amount": "7.00"})
    post(client, reverse("shop:create_store"), {"name": "Corner", "phone": "+15550105"})
    page = client.get(reverse("shop:index"))
    assert page.status_code == 200
    assert b"7.00" in page.content and b"Corner" in page.content
    assert b"closed 30s after it was created" in page.content  # the configured delay


def test_a_store_s_sms_has_the_phone_as_its_key(client: Client, redis_client: redis.Redis) -> None:
    post(client, reverse("shop:create_store"), {"name": "Keyed", "phone": "+15550106"})
    store = Store.objects.get()
    assert redis_client.hget(SMS.flow_keys, f"store-{store.pk}-activation") == b"+15550106"


@override_settings(ORDER_CLOSE_DELAY=0)
def test_the_timeline_shows_what_was_delivered_and_what_is_due(
    client: Client, redis_client: redis.Redis
) -> None:
    post(client, reverse("shop:create_order"), {"amount": "4"})
    post(client, reverse("shop:create_order"), {"amount": "5"})
    first, second = Order.objects.order_by("pk")
    post(client, reverse("shop:pay_order", args=[second.pk]))  # its close is cancelled
    deliver()
    with override_settings(ACTIVATION_SMS_DELAY=10):
        post(client, reverse("shop:create_store"), {"name": "Soon", "phone": "+15550107"})
    html = client.get(reverse("shop:timeline")).content.decode()
    latest = html.split('id="timeline-latest"', 1)[1]
    closed = latest.split(f"order-{first.pk}</code>", 1)[1].split("</tr>", 1)[0]
    assert "delivered" in closed and " ms</td>" in closed  # how late it started
    cancelled = latest.split(f"order-{second.pk}</code>", 1)[1].split("</tr>", 1)[0]
    assert "cancelled" in cancelled
    # The chart: a lane per queue, a mark per run and one for the SMS due in 10 s.
    assert html.count('class="lane-name"') == 2
    assert 'class="mark ack"' in html and 'class="mark cancel"' in html
    assert 'class="mark due"' in html and "due in" in html
    assert client.get(reverse("shop:index")).content.count(b'id="timeline-latest"') == 1


def test_handlers_module_was_autodiscovered() -> None:
    # Nothing in the app imports shop.handlers: django_delayqueue's ready() found it.
    assert dq.topic("order-close").has_listeners()
    assert dq.topic("activation-sms").has_listeners()
    # The SIGTERM test's slow handler is registered only when its queue is configured.
    assert not dq.topic(handlers.SLOW_QUEUE).has_listeners()
