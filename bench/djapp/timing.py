"""What the tasks benchmark's task and signal receiver do: note when each started, and the end.

Each run records, in Redis, how late it started against the due time it carries (a list of
milliseconds, negative for an early start), the first start and the last finish. One RPUSH and
at most two SETs per run: the same work on every path measured.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

LATENESS = "bench:tasks:lateness"
FIRST = "bench:tasks:first"
DONE = "bench:tasks:done"
_client: list[redis.Redis] = []


def _redis() -> redis.Redis:
    if not _client:
        _client.append(redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]))
    return _client[0]


def record(index: int, due_ms: float, last: int) -> None:
    now = time.time()
    client = _redis()
    pipe = client.pipeline(transaction=False)
    pipe.rpush(LATENESS, now * 1000 - due_ms)
    pipe.setnx(FIRST, repr(now))
    if index == last:
        pipe.set(DONE, repr(time.time()))
    pipe.execute()


def on_signal(sender: str, message: Any, **kwargs: Any) -> None:
    payload = message.payload
    record(payload["i"], payload["due"], payload["last"])
