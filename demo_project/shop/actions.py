"""What the shop does when a customer acts: the views call these, and so does the demo's traffic
generator (demo_project/traffic), so that both schedule exactly the same messages.

Each runs in a transaction: the messages it schedules are sent when it commits, so a rolled
back order or store schedules nothing.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal

import django_delayqueue as dq

from .models import Order, Product, Store

ORDER_CLOSE_QUEUE = "order-close"
ACTIVATION_QUEUE = "activation-sms"

# Sent inside the transaction that marks an order paid (receivers: sender=Order, order=...):
# what they schedule is sent when it commits. The demo's partner callback listens to it.
order_paid = Signal()


def order_message_id(order: Order) -> str:
    return f"order-{order.pk}"


def activation_message_id(store: Store) -> str:
    return f"store-{store.pk}-activation"


def open_order(amount: Decimal) -> Order:
    """A new order, closed ``ORDER_CLOSE_DELAY`` seconds later unless it is paid by then."""
    with transaction.atomic():
        order = Order.objects.create(amount=amount)
        dq.schedule(
            ORDER_CLOSE_QUEUE,
            {"order_id": order.pk},
            delay=settings.ORDER_CLOSE_DELAY,
            id=order_message_id(order),
        )
    return order


def pay_order(pk: int) -> tuple[Order, bool]:
    """Mark order ``pk`` paid (Order.DoesNotExist if there is none); returns the order and
    whether this call paid it (False: it was paid or closed already)."""
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=pk)
        if order.status != Order.Status.OPEN:
            return order, False
        order.status = Order.Status.PAID
        order.save(update_fields=["status"])
        order_paid.send(sender=Order, order=order)
    # After the commit: the handler only closes open orders, so a late delivery is harmless.
    dq.cancel(ORDER_CLOSE_QUEUE, order_message_id(order))
    return order, True


def open_store(name: str, phone: str) -> Store:
    """A new store, texted ``ACTIVATION_SMS_DELAY`` seconds later if it has no product by then.

    The SMS carries the phone number as its flow key: a queue limited per key
    (``key_concurrency``, ``key_rate_limit``) never sends two at once to one phone.
    """
    with transaction.atomic():
        store = Store.objects.create(name=name, phone=phone)
        dq.schedule(
            ACTIVATION_QUEUE,
            {"store_id": store.pk},
            delay=settings.ACTIVATION_SMS_DELAY,
            id=activation_message_id(store),
            key=phone,
        )
    return store


def add_product(store: Store, name: str) -> Product:
    return Product.objects.create(store=store, name=name)
