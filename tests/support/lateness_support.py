"""Deliveries whose start lateness is known to the millisecond, for the lateness tests (metrics,
OpenTelemetry, admin, health, queuestats, the browser).

A Worker (what runqueue runs) delivers in burst mode on a ManualClock set to the real time (so
the minute hashes it writes fall in the admin's windows): the clock stands still while it
runs, so every handler starts exactly ``late_ms`` after its due time.
"""

from __future__ import annotations

import time
from typing import Any

import redis

import django_delayqueue as dq
from django_delayqueue.core import ManualClock, Queue, QueueSettings, Reject
from django_delayqueue.worker import Worker

LATE_QUEUE = "late-q"
LATE_QUEUE_SETTINGS = {"backoff_base": 0, "backoff_max": 0, "max_attempts": 3}


def handle(message: dq.Message, **kwargs: Any) -> None:
    """Acknowledge; the payload "reject" is rejected (dead), "flaky" fails its first attempt."""
    if message.payload == "reject":
        raise Reject("no")
    if message.payload == "flaky" and message.attempt == 1:
        raise ValueError("first attempt fails")


def deliver_late(
    client: redis.Redis, payloads: list[Any], late_ms: int, *, warning_ms: float | None = None
) -> Queue:
    """Schedule ``payloads`` due now, then deliver them ``late_ms`` late (a flaky one's retry
    is due at once: 0 ms late). Returns the queue (on the worker's clock)."""
    clock = ManualClock(time.time() * 1000)
    settings = QueueSettings(**LATE_QUEUE_SETTINGS, lateness_warning_ms=warning_ms)
    q = Queue(client, LATE_QUEUE, prefix="dq", settings=settings, clock=clock)
    q.schedule_many([{"payload": p} for p in payloads])
    clock.advance(ms=late_ms)
    dq.topic(LATE_QUEUE).connect(handle)
    try:
        worker = Worker([q], burst=True)
        worker.refresh = lambda: None  # type: ignore[method-assign]  # keep these settings
        assert worker.run() == 0
    finally:
        dq.topic(LATE_QUEUE).disconnect(handle)
    return q
