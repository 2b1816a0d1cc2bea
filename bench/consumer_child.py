"""One core :class:`Consumer` in a process of its own, with a no-op handler that takes notes.

Run by the delivery, lateness, idle and backlog sections as ``python -m bench.consumer_child``.
It prints one JSON line when it stops (after ``--count`` messages, or on SIGTERM).

Lateness is ``handler start - due time``. The due time was computed by the producer on the
queue's clock (Redis server time, kept as an offset to the local clock). The bench runs Redis,
producer and consumer on one host, so Redis' ``TIME`` reads the same kernel clock as
``time.time()`` and the offset is only the error of its measurement (half a round trip, tens of
microseconds): the handler can read the local clock directly and stay sub-millisecond exact.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import redis

from django_delayqueue.core import Message, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--count", type=int, default=None, help="stop after this many")
    parser.add_argument("--claim-batch", type=int, default=QueueSettings().claim_batch)
    parser.add_argument("--lateness", action="store_true", help="record handler lateness")
    parser.add_argument(
        "--slow-ms", type=float, default=0, help="handlers of {'slow': 1} payloads sleep this long"
    )
    parser.add_argument("--profile", default="", help="write a pyinstrument profile here")
    parser.add_argument("--rate-limit", default=None, help="the queue's rate_limit setting")
    parser.add_argument("--max-in-flight", type=int, default=None, help="its max_in_flight")
    parser.add_argument(
        "--progress", type=int, default=0, help="message.progress() calls per handler run"
    )
    args = parser.parse_args(argv)

    client = redis.Redis.from_url(args.url)
    settings = QueueSettings(
        claim_batch=args.claim_batch,
        rate_limit=args.rate_limit,
        max_in_flight=args.max_in_flight,
    )
    queue = Queue(client, args.queue, settings=settings)
    late_ms: list[float] = []
    late_ids: list[str] = []  # late_ms[i] is the lateness of message late_ids[i]
    handled = [0]

    def handler(message: Message) -> None:
        if args.slow_ms and isinstance(message.payload, dict) and message.payload.get("slow"):
            time.sleep(args.slow_ms / 1000)  # a slow API call: not measured
            handled[0] += 1
            return
        for step in range(args.progress):
            message.progress(100 * step / args.progress, "step")
        if args.lateness:
            late_ms.append(time.time() * 1000 - message.due_ms)
            late_ids.append(message.id)
        handled[0] += 1

    consumer = Consumer(
        [queue],
        handler,
        concurrency=args.concurrency,
        max_messages=args.count,
        journal_maxlen=100_000,
        name="bench-consumer",
    )
    consumer.install_signal_handlers()
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    started, cpu_started = time.perf_counter_ns(), time.process_time_ns()
    consumer.run()
    elapsed_ns = time.perf_counter_ns() - started
    cpu_ns = time.process_time_ns() - cpu_started  # this process's CPU: steady on a busy host
    if profiler is not None:
        profiler.stop()
        with open(args.profile, "w") as f:
            f.write(profiler.output_text(unicode=False, color=False, show_all=True))
    report = {
        "delivered": consumer.delivered,
        "handled": handled[0],
        "elapsed_ns": elapsed_ns,
        "cpu_ns": cpu_ns,
        "lateness_ms": late_ms,
        "lateness_ids": late_ids,
    }
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
