"""``python -m bench.djapp.atomic_handler N ROUNDS``: what an atomic queue costs per message.

The same handler, one row inserted in a transaction per message, delivered by an in-process
burst ``Worker`` two ways, interleaved round by round so that machine noise hits each alike:

- ``plain``: a queue that is not atomic; the handler opens its own ``transaction.atomic()``;
- ``atomic``: the queue ``"atomic": True``; the handler inserts its row in the delivery's
  transaction, beside the inbox row (docs/exactly-once.md).

Each round delivers N messages per mode in slices of :data:`SLICE`, the two modes alternating
slice by slice (the first mode alternating too), so that what the machine does meanwhile (a
shared host's load changes over seconds) falls on both alike. Each slice is scheduled due now
(not timed), then the burst that delivers it is timed: wall time, and the CPU time of this
process (all its threads: the loop, the handlers; PostgreSQL's server work is not in it, its
round trips are), which other processes' load hardly moves. Prints ``{"modes": {mode: [wall
us per message, one per round]}, "cpu": {mode: [CPU us per message, one per round]}}``. The
database is the bench's (``BENCH_DB`` SQLite file, or ``BENCH_PG_NAME`` on the local
PostgreSQL).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MODES = ("plain", "atomic")
SLICE = 200  # messages a burst delivers (the queues' claim_batch)
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
    wall: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    n = 0

    def burst(mode: str, size: int) -> tuple[int, int]:
        """Deliver ``size`` new messages on ``mode``'s queue: (wall ns, CPU ns) of the burst."""
        nonlocal n
        q = get_queue(QUEUES[mode])
        for _ in range(size):
            n += 1
            q.schedule(n)
        worker = Worker.for_queues([QUEUES[mode]], burst=True)
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        worker.run()
        return time.perf_counter_ns() - t0, time.process_time_ns() - c0

    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        for mode in MODES:  # warms every path up; not counted
            burst(mode, 50)
        for r in range(rounds):
            spent = {mode: [0, 0] for mode in MODES}
            done = 0
            while done < count:
                size = min(SLICE, count - done)
                turn = (r + done // SLICE) % 2
                for mode in MODES[turn:] + MODES[:turn]:
                    w, c = burst(mode, size)
                    spent[mode][0] += w
                    spent[mode][1] += c
                done += size
            for mode in MODES:
                wall[mode].append(spent[mode][0] / count / 1000)
                cpu[mode].append(spent[mode][1] / count / 1000)
    sys.stdout.write(json.dumps({"modes": wall, "cpu": cpu}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
