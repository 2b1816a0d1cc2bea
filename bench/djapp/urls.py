from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

import django_delayqueue as dq

from .settings import QUEUE


def schedule_view(request: HttpRequest, order: int) -> HttpResponse:
    """What a shop view does: schedule a message (due now) and answer."""
    message_id = dq.schedule(QUEUE, {"order": order})
    return HttpResponse(message_id, content_type="text/plain")


# bench/outbox_cost.py switches the message off to time the view's own work.
ORDER_SCHEDULES = [True]


def order_view(request: HttpRequest, order: int) -> HttpResponse:
    """A checkout: the order row and its close-order message, in one transaction."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_order (n) VALUES (%s)", [order])
        if ORDER_SCHEDULES[0]:
            dq.schedule(QUEUE, {"order": order}, delay=1800)
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [path("schedule/<int:order>/", schedule_view), path("order/<int:order>/", order_view)]
