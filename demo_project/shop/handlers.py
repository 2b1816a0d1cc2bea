"""The shop's delay-queue handlers (found by django_delayqueue's autodiscovery).

Delivery is at least once, so each handler is idempotent: closing an order that is no longer
open, or texting a store that already got its SMS, does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.dispatch import receiver

import django_delayqueue as dq
from django_delayqueue.conf.settings import queue_names

from .models import Order, SentSms, Store
from .sms import send_sms

logger = logging.getLogger(__name__)

ACTIVATION_TEXT = "Welcome to the shop, {name}! Add your first product to open your store."


@receiver(dq.topic("order-close"))
def close_unpaid_order(sender: str, message: dq.Message, **kwargs: Any) -> None:
    closed = Order.objects.filter(pk=message.payload["order_id"], status=Order.Status.OPEN).update(
        status=Order.Status.CLOSED
    )
    if closed:
        logger.info("order %s closed: unpaid", message.payload["order_id"])


@receiver(dq.topic("activation-sms"))
def send_activation_sms(sender: str, message: dq.Message, **kwargs: Any) -> None:
    store = Store.objects.filter(pk=message.payload["store_id"]).first()
    if store is None or store.products.exists():
        return  # deleted, or active already: nothing to nudge
    if SentSms.objects.filter(store=store, kind="activation").exists():
        return  # an earlier delivery sent it; its ack was lost
    send_sms(
        store.phone, ACTIVATION_TEXT.format(name=store.name), kind="activation", store_id=store.pk
    )


# A slow queue for the SIGTERM test (settings add it when DEMO_SLOW_QUEUE=1). Its effect goes
# to Redis, so the test can read it without sharing a database with the subprocess.
SLOW_QUEUE = "demo-slow"
SLOW_STARTED_KEY = "demo:slow:started"
SLOW_DONE_KEY = "demo:slow:done"

if SLOW_QUEUE in queue_names():

    @receiver(dq.topic(SLOW_QUEUE))
    def slow_handler(sender: str, message: dq.Message, **kwargs: Any) -> None:
        from django_delayqueue.conf.connection import get_client

        get_client().rpush(SLOW_STARTED_KEY, message.id)
        time.sleep(float(message.payload.get("seconds", 1.0)))
        get_client().rpush(SLOW_DONE_KEY, message.id)


SLOW_ASYNC_QUEUE = "demo-slow-async"

if SLOW_ASYNC_QUEUE in queue_names():

    @receiver(dq.topic(SLOW_ASYNC_QUEUE))
    async def slow_async_handler(sender: str, message: dq.Message, **kwargs: Any) -> None:
        import asyncio

        from django_delayqueue.conf.connection import get_client

        get_client().rpush(f"{SLOW_STARTED_KEY}:async", message.id)
        try:
            await asyncio.sleep(float(message.payload.get("seconds", 1.0)))
        except asyncio.CancelledError:
            get_client().rpush(f"{SLOW_DONE_KEY}:async:cancelled", message.id)
            raise
        get_client().rpush(f"{SLOW_DONE_KEY}:async", message.id)
