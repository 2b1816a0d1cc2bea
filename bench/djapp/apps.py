from __future__ import annotations

import os
import time
from typing import Any

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench.djapp"
    label = "bench_djapp"

    def ready(self) -> None:
        import django_delayqueue as dq

        from .settings import QUEUE

        dq.topic(QUEUE).connect(on_message, dispatch_uid="bench-e2e")
        from .settings import SIGNAL_QUEUE
        from .timing import on_signal

        dq.topic(SIGNAL_QUEUE).connect(on_signal, dispatch_uid="bench-signal")
        from .limits import on_fast, on_hung
        from .settings import FAST_QUEUE, HUNG_QUEUE

        dq.topic(HUNG_QUEUE).connect(on_hung, dispatch_uid="bench-hung")
        dq.topic(FAST_QUEUE).connect(on_fast, dispatch_uid="bench-fast")
        from .cpu import on_cpu
        from .settings import CPU_DEFAULT_QUEUE, CPU_QUEUE

        dq.topic(CPU_QUEUE).connect(on_cpu, dispatch_uid="bench-cpu")
        dq.topic(CPU_DEFAULT_QUEUE).connect(on_cpu, dispatch_uid="bench-cpu-default")
        from . import sleepers

        sleepers.connect()
        from .settings import RATE_QUEUE

        dq.topic(RATE_QUEUE).connect(on_rate, dispatch_uid="bench-rate")


_seen = [0]


def on_message(sender: str, message: Any, **kwargs: Any) -> None:
    """The handler: when the last expected message arrives, note the time in Redis (once)."""
    _seen[0] += 1
    if _seen[0] == int(os.environ.get("BENCH_E2E_COUNT", "0")):
        from django_delayqueue.api import get_queue

        get_queue(sender).client.set("bench:e2e:done", repr(time.time()))


RATE_STARTS = "bench:rate:starts"
RATE_CLAIMS = "bench:rate:claims"


def on_rate(sender: str, message: Any, **kwargs: Any) -> None:
    """bench/rate_limit.py: note when each rate-limited message started (wall clock, ms) and
    when the round that claimed it began (the consumer's reading of the server clock)."""
    from django_delayqueue.conf.connection import get_client

    pipe = get_client().pipeline(transaction=False)
    pipe.rpush(RATE_STARTS, repr(time.time() * 1000))
    pipe.rpush(RATE_CLAIMS, message.claimed_ms)
    pipe.execute()
