"""Micro-benchmark: the consumer's own cost per message on a handler thread (``Consumer.deliver``
with a no-op handler), without Redis.

Run from a checkout, with its venv::

    .venv/bin/python -m bench.deliver_micro                  # a queue without limits
    .venv/bin/python -m bench.deliver_micro --time-limit 60  # a queue with a time limit

It prints the median of ``--repeats`` timings of ``--count`` calls, in µs per message. No
Redis is contacted: the queue's client is never used by ``deliver`` (outcomes are only
returned), and the clock is the local one. Compare two checkouts in the same minutes (the
machine is shared): run it alternately in each, as ``python -m bench`` is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import redis

from django_delayqueue.core import Message, Queue, QueueSettings, SystemClock
from django_delayqueue.core.consumer.loop import Consumer


def per_message_us(consumer: Consumer, messages: list[Message]) -> float:
    deliver = consumer.deliver
    started = time.perf_counter()
    for m in messages:
        deliver(m)
    return (time.perf_counter() - started) / len(messages) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--time-limit", type=float, default=None, help="the queue's time_limit")
    args = parser.parse_args(argv)

    client = redis.Redis(port=1)  # never connected: deliver does not talk to Redis
    limits = {} if args.time_limit is None else {"time_limit": args.time_limit}
    queue = Queue(client, "micro", settings=QueueSettings(**limits), clock=SystemClock())
    consumer = Consumer([queue], lambda m: None)
    messages = [Message(f"m{i}", "micro", None, 0, 0, 1, str(i)) for i in range(args.count)]
    per_message_us(consumer, messages[: args.count // 10 or 1])  # warm up
    timings = [per_message_us(consumer, messages) for _ in range(args.repeats)]
    print(
        f"Consumer.deliver, no-op handler{'' if args.time_limit is None else ', time limit'}: "
        f"{statistics.median(timings):.2f} µs/message "
        f"(median of {args.repeats} x {args.count}; min {min(timings):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
