"""``python -m bench.cluster_producer URL PREFIX QUEUE SHARDS COUNT FIRST``: one producer of
bench/cluster_shards.py. Schedules COUNT messages (ids FIRST.., due in an hour, a 100-byte
payload) one ``schedule()`` call each on a queue of SHARDS shards of the Redis Cluster that URL
names a node of; prints ``{"elapsed_ns": ...}``."""

from __future__ import annotations

import json
import sys
import time

from django_delayqueue.core.client import connect
from django_delayqueue.core.logical_queue import LogicalQueue
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.sharding import ShardedQueue

from .harness import PAYLOAD_100


def main() -> int:
    url, prefix, name = sys.argv[1], sys.argv[2], sys.argv[3]
    shards, count, first = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    client = connect(url, cluster=True, decode_responses=False)
    queue: LogicalQueue = Queue(client, name, prefix=prefix)
    if shards > 1:
        queue = ShardedQueue([Queue(client, name, prefix=prefix, shard=i) for i in range(shards)])
    queue.schedule(PAYLOAD_100, delay=3600, id=f"warm-{first}")  # scripts loaded, slots known
    t0 = time.perf_counter_ns()
    for n in range(first, first + count):
        queue.schedule(PAYLOAD_100, delay=3600, id=f"m{n}")
    sys.stdout.write(json.dumps({"elapsed_ns": time.perf_counter_ns() - t0}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
