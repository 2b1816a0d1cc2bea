"""``python -m bench.djapp.enqueue PATH N SPREAD_S LEAD_S``: N messages of one path, timed.

PATH is ``signal`` (``dq.schedule`` to the signal queue) or ``tasks`` (``noop.using(run_after=
...).enqueue``, on whichever backend BENCH_TASKS chose). Message i is due at ``start + LEAD_S +
i * SPREAD_S / N``. SPREAD_S 0 and LEAD_S 0 send them without a due time (no ``run_after``,
no ``at=``): due at once, the plain enqueue every backend has. Prints one JSON line: the
enqueue time and its start.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.djapp.settings")
    import django

    django.setup()
    import django_delayqueue as dq

    from .settings import SIGNAL_QUEUE

    path, count = sys.argv[1], int(sys.argv[2])
    spread, lead = float(sys.argv[3]), float(sys.argv[4])
    last = count - 1
    at_once = spread == 0 and lead == 0
    if path == "tasks":
        from .tasks import noop

        def send(i: int, due: float) -> None:
            if at_once:
                noop.enqueue(i, due, last)
                return
            when = datetime.fromtimestamp(due / 1000, tz=timezone.utc)
            noop.using(run_after=when).enqueue(i, due, last)
    else:

        def send(i: int, due: float) -> None:
            payload = {"i": i, "due": due, "last": last}
            at = None if at_once else datetime.fromtimestamp(due / 1000, tz=timezone.utc)
            dq.schedule(SIGNAL_QUEUE, payload, at=at, on_commit=False)

    base = (time.time() + lead) * 1000
    # Whole milliseconds: both paths round a due time up to one, so a due time already whole
    # is exact and "late by" means the same everywhere.
    dues = [float(int(base + i * spread * 1000 / count) + 1) for i in range(count)]
    started = time.time()
    t0 = time.perf_counter_ns()
    for i, due in enumerate(dues):
        send(i, due)
    elapsed_ns = time.perf_counter_ns() - t0
    sys.stdout.write(json.dumps({"started": started, "elapsed_ns": elapsed_ns}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
