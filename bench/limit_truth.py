"""Limits that tell the truth (issue 37): what the delivery timings count as late under a flow
limit, and how often a consumer calls Redis while its queue waits on one.

    python -m bench.limit_truth

Both run consumers in this process (threads, the real loop and scripts) on a private Redis:

- **sms**: the docs' SMS example (``max_in_flight: 10``, three consumers of concurrency 8,
  100 ms handlers, 200 messages due at one instant): how many deliveries the recorded start
  lateness counts more than 100 ms late (its buckets above 100 ms), the lateness p99, and the
  limit wait against the whole wait (limit wait + lateness). The cap holds every message
  after the first ten, whichever consumer refills which slot: none should read late.
- **poll**: ``rate_limit: "100/s"`` with ``key_concurrency: 1``, two keys whose first
  messages run (handlers that block) while their others wait for the key's slot: script calls
  a second of one consumer (the idle poll is one promote and one claim a second).
"""

from __future__ import annotations

import threading
import time

import redis

from django_delayqueue.core import Queue, QueueSettings, SystemClock
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.timings.buckets import BOUNDS_MS
from django_delayqueue.core.timings.counts import TimingCounts

from .harness import private_redis

EMPTY = {"pending": 0, "ready": 0, "unack": 0, "retry": 0, "garbage": 0}


def sms(client: redis.Redis) -> str:
    settings = QueueSettings(max_in_flight=10, concurrency=8, visibility_timeout=60)
    queues = [
        Queue(client, "activation-sms", clock=SystemClock(), settings=settings) for _ in range(3)
    ]
    queues[0].schedule_many([{"payload": i, "delay": 1.0} for i in range(200)])
    consumers = [Consumer([q], lambda m: time.sleep(0.1)) for q in queues]
    threads = [threading.Thread(target=c.run, daemon=True) for c in consumers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while queues[0].counts() != EMPTY and time.monotonic() < deadline:
        time.sleep(0.1)
    for c in consumers:
        c.request_stop()  # flushes its timings
    for t in threads:
        t.join(30)
    flat = [v for pair in client.hgetall(queues[0].keys.timings).items() for v in pair]
    got = TimingCounts.from_hash(flat)
    buckets = zip([*BOUNDS_MS, float("inf")], got.histograms["lateness"], strict=True)
    over = sum(n for bound, n in buckets if bound > 100)
    waited, late = got.sums["limit_wait"], got.sums["lateness"]
    p99 = got.quantile_ms("lateness", 0.99) or 0
    share = 100 * waited / max(1, waited + late)
    return (
        f"sms: {got.count('lateness')} deliveries, {over} counted more than 100 ms late, "
        f"lateness p99 {p99:.0f} ms; limit wait {waited / 1000:.1f} s of "
        f"{(waited + late) / 1000:.1f} s waited in all ({share:.0f} %)"
    )


def poll(client: redis.Redis) -> str:
    client.flushall()
    settings = QueueSettings(
        rate_limit="100/s", key_concurrency=1, concurrency=4, visibility_timeout=60
    )
    q = Queue(client, "sms", clock=SystemClock(), settings=settings)
    for key in ("a", "b"):
        for n in range(5):
            q.schedule({"n": n}, key=key)
    release = threading.Event()
    consumer = Consumer([q], lambda m: release.wait(30), idle_seconds=1)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    time.sleep(1.0)  # both keys' first messages run: the others wait for their key's slot
    client.config_resetstat()
    time.sleep(3.0)
    stats = client.info("commandstats")
    calls = sum(stats.get(name, {}).get("calls", 0) for name in ("cmdstat_evalsha", "cmdstat_eval"))
    release.set()
    consumer.request_stop()
    thread.join(30)
    return f"poll: {calls / 3:.1f} script calls a second while the keys wait for a slot"


def main() -> None:
    with private_redis() as bench:
        print(sms(bench.client))
        print(poll(bench.client))


if __name__ == "__main__":
    main()
