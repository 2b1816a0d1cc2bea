"""The shop's pages: create and pay orders, create stores and add products, see sent SMS."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.apps import apps
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from . import actions, timeline
from .models import Order, SentSms, Store


def index(request: HttpRequest) -> HttpResponse:
    context = {
        "orders": Order.objects.all()[:10],
        "stores": Store.objects.prefetch_related("products")[:10],
        "order_close_delay": settings.ORDER_CLOSE_DELAY,
        "activation_sms_delay": settings.ACTIVATION_SMS_DELAY,
        "traffic": apps.is_installed("demo_project.traffic"),
        **_timeline_context(),
    }
    return render(request, "shop/index.html", context)


def timeline_fragment(request: HttpRequest) -> HttpResponse:
    """The timeline alone: the shop page fetches it every two seconds."""
    return render(request, "shop/timeline.html", _timeline_context())


def _timeline_context() -> dict[str, object]:
    events = timeline.read_timeline()
    return {"timeline": events, "chart": timeline.chart(events)}


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
    order = actions.open_order(amount)
    messages.info(
        request, f"Order #{order.pk} closes in {settings.ORDER_CLOSE_DELAY:g}s unless paid."
    )
    return redirect("shop:index")


@require_POST
def pay_order(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        order, paid = actions.pay_order(pk)
    except Order.DoesNotExist:
        raise Http404(f"no order {pk}") from None
    if not paid:
        messages.error(request, f"Order #{order.pk} is {order.get_status_display().lower()}.")
        return redirect("shop:index")
    messages.info(request, f"Order #{order.pk} paid.")
    return redirect("shop:index")


@require_POST
def create_store(request: HttpRequest) -> HttpResponse:
    name, phone = request.POST.get("name", "").strip(), request.POST.get("phone", "").strip()
    if not name or not phone:
        return HttpResponseBadRequest("name and phone are required")
    store = actions.open_store(name, phone)
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
    actions.add_product(store, name)
    messages.info(request, f"{name} added to {store.name}.")
    return redirect("shop:index")


def sent_sms(request: HttpRequest) -> HttpResponse:
    return render(request, "shop/sms.html", {"sms": SentSms.objects.select_related("store")[:50]})
