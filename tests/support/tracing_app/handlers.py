"""Receivers of the traced queues: each delivery is noted in Redis (``DELIVERED``) with the
trace id current in the handler (None without OpenTelemetry), inside a span of its own."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import redis

import django_delayqueue as dq

from .notes import DELIVERED

QUEUE = "traced"
ASYNC_QUEUE = "traced-async"


def _note(message: dq.Message) -> None:
    trace_id = None
    if sys.modules.get("opentelemetry") is not None:  # None: hidden by the test
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        trace_id = f"0x{context.trace_id:032x}" if context.is_valid else None
    hidden = "opentelemetry" in sys.modules and sys.modules["opentelemetry"] is None
    note = {"id": message.id, "payload": message.payload, "trace_id": trace_id, "hidden": hidden}
    redis.Redis.from_url(os.environ["REDIS_URL"]).rpush(DELIVERED, json.dumps(note))


def _work(message: dq.Message) -> None:
    if sys.modules.get("opentelemetry") is None:
        _note(message)
    else:
        from opentelemetry import trace

        with trace.get_tracer("tracing_app").start_as_current_span("handler work"):
            _note(message)
    if message.payload.get("fail"):
        raise ValueError(f"order {message.payload['order']} cannot be closed")


@dq.topic(QUEUE).connect
def close_order(message: dq.Message, **kwargs: Any) -> None:
    _work(message)


async def close_order_async(message: dq.Message, **kwargs: Any) -> None:
    _work(message)


dq.topic(ASYNC_QUEUE).connect(close_order_async)
