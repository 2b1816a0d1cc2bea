"""The shop's pages: create and pay orders, create stores and add products, see sent SMS."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

import django_delayqueue as dq

from .models import Order, Product, SentSms, Store

ORDER_CLOSE_QUEUE = "order-close"
ACTIVATION_QUEUE = "activation-sms"


def order_message_id(order: Order) -> str:
    return f"order-{order.pk}"


def activation_message_id(store: Store) -> str:
    return f"store-{store.pk}-activation"


def index(request: HttpRequest) -> HttpResponse:
    context = {
        "orders": Order.objects.all()[:20],
        "stores": Store.objects.prefetch_related("products")[:20],
        "order_close_delay": settings.ORDER_CLOSE_DELAY,
        "activation_sms_delay": settings.ACTIVATION_SMS_DELAY,
    }
    return render(request, "shop/index.html", context)


@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    try:
        # The model field's own check: "nan", "inf" or 1e30 parse as Decimal but do not fit.
        amount = Order._meta.get_field("amount").clean(
            Decimal(request.POST.get("amount", "")), None
        )
    except (InvalidOperation, ValidationError):
        return HttpResponseBadRequest(
            "amount must be a number with at most 8 digits before the point"
        )
    with transaction.atomic():
        order = Order.objects.create(amount=amount)
        # Sent when the order commits; a rolled-back order schedules nothing.
        dq.schedule(
            ORDER_CLOSE_QUEUE,
            {"order_id": order.pk},
            delay=settings.ORDER_CLOSE_DELAY,
            id=order_message_id(order),
        )
    messages.info(
        request, f"Order #{order.pk} closes in {settings.ORDER_CLOSE_DELAY:g}s unless paid."
    )
    return redirect("shop:index")


@require_POST
def pay_order(request: HttpRequest, pk: int) -> HttpResponse:
    with transaction.atomic():
        order = get_object_or_404(Order.objects.select_for_update(), pk=pk)
        if order.status != Order.Status.OPEN:
            messages.error(request, f"Order #{order.pk} is {order.get_status_display().lower()}.")
            return redirect("shop:index")
        order.status = Order.Status.PAID
        order.save(update_fields=["status"])
    # After the commit: the handler only closes open orders, so a late delivery is harmless.
    dq.cancel(ORDER_CLOSE_QUEUE, order_message_id(order))
    messages.info(request, f"Order #{order.pk} paid.")
    return redirect("shop:index")


@require_POST
def create_store(request: HttpRequest) -> HttpResponse:
    name, phone = request.POST.get("name", "").strip(), request.POST.get("phone", "").strip()
    if not name or not phone:
        return HttpResponseBadRequest("name and phone are required")
    with transaction.atomic():
        store = Store.objects.create(name=name, phone=phone)
        dq.schedule(
            ACTIVATION_QUEUE,
            {"store_id": store.pk},
            delay=settings.ACTIVATION_SMS_DELAY,
            id=activation_message_id(store),
        )
    messages.info(
        request,
        f"{store.name} gets an activation SMS in {settings.ACTIVATION_SMS_DELAY:g}s "
        "unless it adds a product.",
    )
    return redirect("shop:index")


@require_POST
def add_product(request: HttpRequest, pk: int) -> HttpResponse:
    store = get_object_or_404(Store, pk=pk)
    name = request.POST.get("name", "").strip()
    if not name:
        return HttpResponseBadRequest("name is required")
    Product.objects.create(store=store, name=name)
    messages.info(request, f"{name} added to {store.name}.")
    return redirect("shop:index")


def sent_sms(request: HttpRequest) -> HttpResponse:
    return render(request, "shop/sms.html", {"sms": SentSms.objects.select_related("store")[:50]})
