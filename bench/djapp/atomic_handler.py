"""``python -m bench.djapp.atomic_handler N ROUNDS``: what an atomic queue costs per message.

The same handler, one row inserted in a transaction per message, delivered by an in-process
burst ``Worker`` two ways, interleaved round by round so that machine noise hits each alike:

- ``plain``: a queue that is not atomic; the handler opens its own ``transaction.atomic()``;
- ``atomic``: the queue ``"atomic": True``; the handler inserts its row in the delivery's
  transaction, beside the inbox row (docs/exactly-once.md).

Each round schedules N messages due now (not timed), then times the burst that delivers them
(its start, the same for both, is amortised over N). Prints ``{"modes": {mode: [us per
message, one per round]}}``. The database is the bench's (``BENCH_DB`` SQLite file, or
``BENCH_PG_NAME`` on the local PostgreSQL).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MODES = ("plain", "atomic")
QUEUES = {"plain": "bench-plain-handler", "atomic": "bench-atomic-handler"}


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.djapp.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection, transaction
    from django.test import override_settings

    import django_delayqueue as dq
    from django_delayqueue.conf.queues import get_queue
    from django_delayqueue.worker import Worker

    count, rounds = int(sys.argv[1]), int(sys.argv[2])
    key = "SERIAL PRIMARY KEY" if connection.vendor == "postgresql" else "INTEGER PRIMARY KEY"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS bench_effect (id {key}, n INTEGER)")

    def insert(message: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_effect (n) VALUES (%s)", [message.payload])

    def plain(sender: str, message: Any, **kwargs: Any) -> None:
        with transaction.atomic():
            insert(message)

    def atomic(sender: str, message: Any, **kwargs: Any) -> None:
        insert(message)

    dq.topic(QUEUES["plain"]).connect(plain, weak=False)
    dq.topic(QUEUES["atomic"]).connect(atomic, weak=False)
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUES["plain"]: {"claim_batch": 200},
        QUEUES["atomic"]: {"claim_batch": 200, "atomic": True},
    }
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        n = 0
        for r in range(rounds + 1):  # round 0 warms every path up and is not counted
            for mode in MODES[r % 2 :] + MODES[: r % 2]:
                q = get_queue(QUEUES[mode])
                size = count if r else 50
                for _ in range(size):
                    n += 1
                    q.schedule(n)
                worker = Worker.for_queues([QUEUES[mode]], burst=True)
                t0 = time.perf_counter_ns()
                worker.run()
                elapsed = time.perf_counter_ns() - t0
                if r:
                    results[mode].append(elapsed / size / 1000)
    sys.stdout.write(json.dumps({"modes": results}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
