"""Views of the tracing tests: each schedules inside a span of its own, in a transaction (so
the message goes through the outbox), as a view of an instrumented project would (there the
span is the request's, made by opentelemetry-instrumentation-django)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path

import django_delayqueue as dq

TRACER: Any = None  # set by the test: the tracer of its private provider


def close_later(request: HttpRequest, queue: str, order: int) -> JsonResponse:
    fail = request.GET.get("fail") == "1"
    with TRACER.start_as_current_span(f"POST /close-later/{queue}") as span, transaction.atomic():
        message_id = dq.schedule(queue, {"order": order, "fail": fail})
    context = span.get_span_context()
    return JsonResponse({"id": message_id, "trace_id": f"0x{context.trace_id:032x}"})


def close_task_later(request: HttpRequest, order: int) -> JsonResponse:
    from tracing_app.tasks import close_order

    fail = request.GET.get("fail") == "1"
    with TRACER.start_as_current_span("POST /close-task-later") as span:
        result = close_order.enqueue(order, fail=fail)
    context = span.get_span_context()
    return JsonResponse({"id": result.id, "trace_id": f"0x{context.trace_id:032x}"})


urlpatterns = [
    path("close-later/<str:queue>/<int:order>", close_later),
    path("close-task-later/<int:order>", close_task_later),
]
