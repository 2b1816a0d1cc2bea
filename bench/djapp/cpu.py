"""The CPU-bound receiver of ``bench/processes.py``: 20 ms of pure Python per message.

It burns 20 ms of its own thread's CPU time (not wall time: on a shared machine a handler that
waits for a core still does the same work), then counts the message in Redis, and which process
ran it (``SPLIT``: pid -> messages); the message that brings the count to the payload's
``count`` notes the end.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .timing import DONE, FIRST, _redis

CPU_SECONDS = 0.020
COUNTED = "bench:cpu:counted"
SPLIT = "bench:cpu:split"


def on_cpu(sender: str, message: Any, **kwargs: Any) -> None:
    client = _redis()
    client.setnx(FIRST, repr(time.time()))
    start = time.thread_time()
    n = 0
    while time.thread_time() - start < CPU_SECONDS:
        n += sum(i * i for i in range(200))  # pure Python work, the GIL held
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(SPLIT, str(os.getpid()), 1)
    pipe.incr(COUNTED)
    if pipe.execute()[1] == int(message.payload["count"]):
        client.set(DONE, repr(time.time()))
