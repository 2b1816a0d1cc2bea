"""A task the tracing tests enqueue (module level, as the Tasks framework requires)."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

from tracing_app.notes import DELIVERED

TASK_QUEUE = "traced-tasks"


@task(queue_name=TASK_QUEUE)
def close_order(order: int, fail: bool = False) -> int:
    import json
    import os

    import redis
    from opentelemetry import trace

    with trace.get_tracer("tracing_app").start_as_current_span("task work"):
        context = trace.get_current_span().get_span_context()
        note = {"order": order, "trace_id": f"0x{context.trace_id:032x}"}
        redis.Redis.from_url(os.environ["REDIS_URL"]).rpush(DELIVERED, json.dumps(note))
    if fail:
        raise ValueError(f"order {order} cannot be closed")
    return order
