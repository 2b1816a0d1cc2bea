"""The outbox drill's producer: ``dq.schedule`` in transactions, as a view would, in a process
of its own (tests/drills/test_outbox_drill.py runs it while the drill's Redis is down).

    python outbox_producer.py produce N   # prints {"committed": {id: due_ms}, "rolled_back": [...]}
    python outbox_producer.py count       # prints the number of outbox rows

Settings: drill_settings (the environment names Redis and the database).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "drill_settings")

import django

django.setup()

from django.db import transaction  # noqa: E402

import django_delayqueue as dq  # noqa: E402
from django_delayqueue.models import OutboxMessage  # noqa: E402

# Due now (overdue by the time Redis is back), soon, and later than the outage lasts.
DELAYS = (0, 1.5, 6.0)


class Rollback(Exception):
    pass


def produce(count: int) -> dict[str, object]:
    committed: dict[str, int] = {}
    rolled_back = []
    for i in range(count):
        message_id = f"c{i}"
        with transaction.atomic():
            dq.schedule("drill", {"do": "ok"}, delay=DELAYS[i % 3], id=message_id)
        committed[message_id] = OutboxMessage.objects.get(message_id=message_id).due_ms
        if i % 10 == 0:
            try:
                with transaction.atomic():
                    dq.schedule("drill", {"do": "ok"}, id=f"rb{i}")
                    raise Rollback
            except Rollback:
                rolled_back.append(f"rb{i}")
    return {"committed": committed, "rolled_back": rolled_back}


def main() -> None:
    command = sys.argv[1]
    if command == "produce":
        print(json.dumps(produce(int(sys.argv[2]))))
    elif command == "count":
        print(OutboxMessage.objects.count())
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
