"""The receivers of bench/hung_limits.py: a handler that hangs in a socket read with no timeout
(only a process replacement ends it), and a fast one that notes how late it started."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis

HUNG_STARTS = "bench:limits:hung"  # one JSON per start: id, started (s), pid
FAST_LATENESS = "bench:limits:lateness"  # ms late per fast message (negative: early)
_client: list[redis.Redis] = []


def _redis() -> redis.Redis:
    if not _client:
        _client.append(redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]))
    return _client[0]


def on_hung(sender: str, message: Any, **kwargs: Any) -> None:
    started = time.time()
    note = {"id": message.id, "started": started, "pid": os.getpid()}
    _redis().rpush(HUNG_STARTS, json.dumps(note))
    if message.payload.get("hang"):
        reader, _writer = socket.socketpair()
        reader.recv(1)  # an SMS gateway without a timeout: blocked in C, never returns


def on_fast(sender: str, message: Any, **kwargs: Any) -> None:
    _redis().rpush(FAST_LATENESS, time.time() * 1000 - message.due_ms)
