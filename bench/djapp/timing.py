"""What the tasks benchmark's task and signal receiver do: note when each started, and the end.

Each run notes, in the consumer's memory, how late it started against the due time it carries
(milliseconds, negative for an early start); the first run of a process writes the first start
to Redis, and the run that completes the set (``last + 1`` runs in this process) writes them all
and the last finish. Nothing else touches Redis: the same work on every path measured, and a
delivery rate that is the path's own, not that of a round trip per message in the handler.
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


_lateness: list[float] = []


def record(index: int, due_ms: float, last: int) -> None:
    now = time.time()
    if not _lateness:
        _redis().setnx(FIRST, repr(now))
    _lateness.append(now * 1000 - due_ms)
    if len(_lateness) == last + 1:  # every message of the run ran here: write them down
        pipe = _redis().pipeline(transaction=False)
        pipe.rpush(LATENESS, *_lateness)
        pipe.set(DONE, repr(time.time()))
        pipe.execute()
        _lateness.clear()


def on_signal(sender: str, message: Any, **kwargs: Any) -> None:
    payload = message.payload
    record(payload["i"], payload["due"], payload["last"])
