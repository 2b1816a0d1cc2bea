"""Micro-benchmark: the consumer's own cost per message on a handler thread (``Consumer.deliver``
with a no-op handler), without Redis.

Run from a checkout, with its venv::

    .venv/bin/python -m bench.deliver_micro                  # a queue without limits
    .venv/bin/python -m bench.deliver_micro --time-limit 60  # a queue with a time limit
    .venv/bin/python -m bench.deliver_micro --threads 8      # through 8 handler threads

It prints the median (and the least) of ``--repeats`` timings of ``--count`` messages, in µs of
this process's CPU time per message (``time.process_time``: on a shared machine wall time would
also count the turns of other processes). With
``--threads N`` the messages go through the queue's N handler threads as the loop hands them
over (added ``claim_batch`` at a time, their outcomes taken when the threads say a round is
worth it): the threads' own bookkeeping is measured too. No Redis is contacted: the queue's
client is never used by ``deliver`` (outcomes are only returned), and the clock is the local
one. Compare two checkouts in the same minutes (the
machine is shared): run it alternately in each, as ``python -m bench`` is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

import redis

from django_delayqueue.core import Message, Queue, QueueSettings, SystemClock
from django_delayqueue.core.consumer.handlers.threads_by_queue import ThreadsByQueue
from django_delayqueue.core.consumer.loop import Consumer


def deliverer(consumer: Consumer) -> Any:
    """What the handler threads call: the consumer's delivery part (the consumer itself
    before it was a part of its own)."""
    return getattr(consumer, "_delivery", consumer)


def per_message_us(consumer: Consumer, messages: list[Message]) -> float:
    deliver = deliverer(consumer).deliver
    started = time.process_time()
    for m in messages:
        deliver(m)
    return (time.process_time() - started) / len(messages) * 1e6


class Waker:
    """The loop's waiter, as the handler threads see it: an event the bench waits on."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def nudge(self) -> None:
        self.event.set()

    def remind(self, at_monotonic: float) -> None:
        self.event.set()  # no timer: the bench takes what finished at once


def through_threads_us(consumer: Consumer, messages: list[Message], size: int) -> float:
    """Per message: handed to ``size`` handler threads, ``claim_batch`` at a time, while they
    have room (as the loop does), until every outcome was taken."""
    waker = Waker()
    coroutines = getattr(consumer, "coroutines", None)  # none before issue 26
    extra = () if coroutines is None else (coroutines,)
    threads = ThreadsByQueue(deliverer(consumer), waker, *extra)
    name = messages[0].queue
    threads.start(name, size)
    pool = threads[name]
    batch = consumer.queues[0].settings.claim_batch
    taken, left = 0, list(messages)
    started = time.process_time()
    while taken < len(messages):
        room = pool.room(batch)
        if left and room:
            part, left = left[:room], left[room:]
            threads.add(part)
        waker.event.wait(0.001)
        waker.event.clear()
        taken += len(threads.take_finished())
    elapsed = time.process_time() - started
    threads.close()
    return elapsed / len(messages) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--time-limit", type=float, default=None, help="the queue's time_limit")
    parser.add_argument("--threads", type=int, default=0, help="through N handler threads")
    args = parser.parse_args(argv)

    client = redis.Redis(port=1)  # never connected: deliver does not talk to Redis
    limits = {} if args.time_limit is None else {"time_limit": args.time_limit}
    queue = Queue(client, "micro", settings=QueueSettings(**limits), clock=SystemClock())
    consumer = Consumer([queue], lambda m: None)
    messages = [Message(f"m{i}", "micro", None, 0, 0, 1, str(i)) for i in range(args.count)]
    if args.threads:
        what = f"{args.threads} handler threads"

        def timing(ms: list[Message]) -> float:
            return through_threads_us(consumer, ms, args.threads)
    else:
        what = "Consumer.deliver"

        def timing(ms: list[Message]) -> float:
            return per_message_us(consumer, ms)

    timing(messages[: args.count // 10 or 1])  # warm up
    timings = [timing(messages) for _ in range(args.repeats)]
    print(
        f"{what}, no-op handler{'' if args.time_limit is None else ', time limit'}: "
        f"{statistics.median(timings):.2f} µs/message "
        f"(median of {args.repeats} x {args.count}; min {min(timings):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
