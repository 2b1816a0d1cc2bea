"""The Sentinel drill's producer: ``dq.schedule`` through the app's settings (drill_settings,
``$DRILL_SENTINEL``), as a view does: each message in a transaction of its own, with the outbox.
A send that fails after the commit (Redis down, or ``NotReplicated``) leaves the message in the
outbox for ``runqueue``'s relay, which sends it under the row's token: never twice. (Retrying
``dq.schedule`` by hand after ``NotReplicated`` would re-create a message that was delivered in
between: that is what the outbox's token prevents.)

    python sentinel_producer.py OUT COUNT INTERVAL_SECONDS

Each message ``s<i>`` is due 300 ms after it is scheduled. Every line of OUT is
``{"id": ..., "due_ms": ...}``, written with fsync once its transaction committed (returned).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "drill_settings")

import django

django.setup()

from django.db import transaction  # noqa: E402

import django_delayqueue as dq  # noqa: E402


def main() -> int:
    out, count, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with open(out, "a") as f:
        for i in range(count):
            # The local clock: the Redis one may be between primaries right now.
            due_ms = int(time.time() * 1000) + 300
            with transaction.atomic():
                dq.schedule("drill", {"do": "ok"}, at=due_ms, id=f"s{i}")
            f.write(json.dumps({"id": f"s{i}", "due_ms": due_ms}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            time.sleep(interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
