"""The peer: huey with its Redis storage, one consumer process, a no-op task that takes notes.

Run as ``python -m bench.huey_child``; the parent schedules through :func:`make_huey` too, so
both sides register the same task name. Lateness is measured the same way as ours (local clock,
one host: see ``consumer_child``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any


def make_huey(url: str) -> tuple[Any, Any]:
    """A RedisHuey on ``url`` (results off, like our no-op handler) and its ``noop`` task."""
    from huey import RedisHuey

    huey = RedisHuey("bench", url=url, results=False, utc=True)
    notes: dict[str, Any] = {"late_ms": [], "count": 0, "done": threading.Event(), "target": 0}
    lock = threading.Lock()

    @huey.task(name="bench.noop")
    def noop(due_ms: int, record: bool = False) -> None:
        late = time.time() * 1000 - due_ms
        with lock:
            if record:
                notes["late_ms"].append(late)
            notes["count"] += 1
            if notes["count"] >= notes["target"]:
                notes["done"].set()

    noop.notes = notes
    return huey, noop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)

    huey, noop = make_huey(args.url)
    notes = noop.notes
    notes["target"] = args.count
    consumer = huey.create_consumer(
        workers=args.workers, worker_type="thread", periodic=False, check_worker_health=False
    )
    started = time.perf_counter_ns()
    consumer.start()
    finished = notes["done"].wait(args.timeout)
    elapsed_ns = time.perf_counter_ns() - started
    consumer.stop(graceful=False)
    report = {
        "delivered": notes["count"],
        "finished": finished,
        "elapsed_ns": elapsed_ns,
        "lateness_ms": notes["late_ms"],
    }
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    # Worker threads may sit in a blocking pop for another second: do not wait for them.
    os._exit(0)


if __name__ == "__main__":
    # huey names a task after its module: run the imported module, not ``__main__``, so the
    # name matches the parent's (bench.huey_child).
    from bench.huey_child import main as imported_main

    raise SystemExit(imported_main())
