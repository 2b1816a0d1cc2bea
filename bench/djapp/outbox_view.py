"""``python -m bench.djapp.outbox_view N ROUNDS``: what the outbox costs a view, per request.

The view (``/order/<n>/``) does what a shop's checkout does: inside ``transaction.atomic`` it
inserts an order row and schedules its close-order message (due in 30 minutes). Three ways,
interleaved round by round so that machine noise hits each alike:

- ``insert only``: the order row alone (the view's own cost, no message);
- ``without outbox``: the row, and ``dq.schedule`` sending on commit (``OUTBOX=False``);
- ``with outbox``: the row, the outbox row in the same transaction, the send on commit and the
  outbox row's delete (``OUTBOX=True``).

Prints ``{"modes": {mode: [us per request, one per round]}}``. The database is the bench's
(``BENCH_DB`` SQLite file, or ``BENCH_PG_NAME`` on the local PostgreSQL).
"""

from __future__ import annotations

import json
import os
import sys
import time

MODES = ("insert only", "without outbox", "with outbox")


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.djapp.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test import Client, override_settings

    from . import urls

    count, rounds = int(sys.argv[1]), int(sys.argv[2])
    key = "SERIAL PRIMARY KEY" if connection.vendor == "postgresql" else "INTEGER PRIMARY KEY"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS bench_order (id {key}, n INTEGER)")
    client = Client()
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    n = 0
    for r in range(rounds + 1):  # round 0 warms every path up and is not counted
        for mode in MODES[r % 3 :] + MODES[: r % 3]:
            outbox = mode == "with outbox"
            urls.ORDER_SCHEDULES[0] = mode != "insert only"
            with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OUTBOX": outbox}):
                t0 = time.perf_counter_ns()
                for _ in range(count if r else 50):
                    n += 1
                    if client.get(f"/order/{n}/").status_code != 200:
                        raise SystemExit(f"request {n} failed ({mode})")
                elapsed = time.perf_counter_ns() - t0
            if r:
                results[mode].append(elapsed / count / 1000)
    sys.stdout.write(json.dumps({"modes": results}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
