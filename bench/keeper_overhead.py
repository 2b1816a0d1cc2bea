"""What keeping recurring schedules costs the delivery path: ``python -m bench.keeper_overhead``.

One queue on a private redis-server, ``--count`` no-op messages due at once, delivered by a
burst consumer with no schedules (``keeper=None``) and by one that keeps ``--schedules`` hourly
schedules on the same queue (their plans are computed every round; no tick comes due during the
run). Runs alternate, ``--runs`` of each, and the best of each is printed with the ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import redis

from django_delayqueue.core import Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper
from django_delayqueue.embedded import RedisServerProcess


def deliver(client: redis.Redis, count: int, schedules: int) -> float:
    q = Queue(client, "bench-keeper", settings=QueueSettings(claim_batch=100, concurrency=1))
    client.flushall()
    q.schedule_many({"payload": i} for i in range(count))
    keeper = None
    if schedules:
        keeper = ScheduleKeeper()
        hourly = [Recurrence(f"s{i}", q.name, every=3600) for i in range(schedules)]
        keeper.set_definitions(hourly, [q])
    consumer = Consumer([q], lambda m: None, burst=True, keeper=keeper)
    started = time.perf_counter()
    consumer.run()
    elapsed = time.perf_counter() - started
    assert q.counts()["ready"] == 0
    return consumer.delivered / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--schedules", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with RedisServerProcess() as server:
        client = redis.Redis.from_url(server.url)
        without, with_keeper = [], []
        for _ in range(args.runs):
            without.append(deliver(client, args.count, 0))
            with_keeper.append(deliver(client, args.count, args.schedules))
    result = {
        "count": args.count,
        "schedules": args.schedules,
        "no_keeper_msg_s": max(without),
        "keeper_msg_s": max(with_keeper),
        "ratio": max(with_keeper) / max(without),
        "runs": {"no_keeper": without, "keeper": with_keeper},
    }
    print(
        f"{args.count:,} no-op messages, best of {args.runs}: no schedules "
        f"{result['no_keeper_msg_s']:,.0f} msg/s; {args.schedules} schedules kept "
        f"{result['keeper_msg_s']:,.0f} msg/s ({result['ratio']:.2f}x)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
