"""The demo's delay-queue handlers (found by django_delayqueue's autodiscovery): the partner
callback and the recurring sales report. The shop's own are in demo_project/shop/handlers.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.dispatch import receiver

import django_delayqueue as dq
from demo_project.shop.models import Order, SentSms

from . import partner
from .models import SalesReport


@receiver(dq.topic(partner.QUEUE))
def tell_the_partner(sender: str, message: dq.Message, **kwargs: Any) -> None:
    payload = message.payload
    partner.notify(int(payload["order_id"]), Decimal(payload["amount"]), message.attempt)


@receiver(dq.topic("shop-reports"))
def sales_report(sender: str, message: dq.Message, **kwargs: Any) -> None:
    """Each tick of the "sales-report" schedule (settings.DELAYQUEUE["SCHEDULES"]): the shop's
    figures at the tick's instant, one row per tick however often it is delivered."""
    by_status = {status: Order.objects.filter(status=status).count() for status in Order.Status}
    SalesReport.objects.get_or_create(
        tick=message.id,
        defaults={
            "due_at": message.due_at,
            "orders_open": by_status[Order.Status.OPEN],
            "orders_paid": by_status[Order.Status.PAID],
            "orders_closed": by_status[Order.Status.CLOSED],
            "sms_sent": SentSms.objects.count(),
        },
    )
