"""Receivers of bench/async_handlers.py: each waits a second (``await asyncio.sleep(1)``, or
``time.sleep(1)`` for the sync reference), counts itself, and the last one notes the time."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import redis

ASYNC_QUEUE = "bench-async-sleep"
SYNC_QUEUE = "bench-sync-sleep"
DONE = "bench:sleepers:done"
_count = [0]
_lock = threading.Lock()


def _finished() -> None:
    with _lock:
        _count[0] += 1
        last = _count[0] == int(os.environ.get("BENCH_SLEEPERS", "0"))
    if last:
        redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]).set(DONE, repr(time.time()))


async def sleeps_async(sender: str, message: Any, **kwargs: Any) -> None:
    await asyncio.sleep(1)
    _finished()


def sleeps_sync(sender: str, message: Any, **kwargs: Any) -> None:
    time.sleep(1)
    _finished()


def connect() -> None:
    import django_delayqueue as dq

    dq.topic(ASYNC_QUEUE).connect(sleeps_async, dispatch_uid="bench-async-sleep")
    dq.topic(SYNC_QUEUE).connect(sleeps_sync, dispatch_uid="bench-sync-sleep")
