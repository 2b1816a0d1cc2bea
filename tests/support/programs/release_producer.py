"""A producer of whichever release is first on ``PYTHONPATH`` (the upgrade drill runs it with the
release before envelope formats, extracted from git): it schedules, on queue ``$DRILL_QUEUE``
of ``$REDIS_URL``, ``$DRILL_COUNT`` messages of each kind its envelopes carry (plain, with a
flow key, with a trace context) and prints their ids and due times as JSON.

Only what both releases offer is used (``Queue.schedule``, ``encode_envelope``,
``send_prepared``), so it runs on this checkout too.
"""

from __future__ import annotations

import json
import os

import redis

import django_delayqueue
from django_delayqueue.core import Queue
from django_delayqueue.core.envelope import encode_envelope, encode_payload
from django_delayqueue.core.results import Prepared

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def main() -> None:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    q = Queue(client, os.environ["DRILL_QUEUE"], prefix="dq")
    count = int(os.environ.get("DRILL_COUNT", "3"))
    due: dict[str, int] = {}
    for i in range(count):
        plain = q.schedule({"n": i}, id=f"prev-plain-{i}")
        keyed = q.schedule({"n": i}, id=f"prev-keyed-{i}", key=f"store-{i % 2}")
        now = q.clock.now_ms()
        envelope = encode_envelope(encode_payload({"n": i}), now, now, trace=TRACE)
        traced = q.send_prepared(Prepared(f"prev-traced-{i}", now, envelope))
        for result in (plain, keyed, traced):
            assert result.created, result
            due[result.id] = result.due_ms
    print(json.dumps({"package": django_delayqueue.__file__, "due": due}))


if __name__ == "__main__":
    main()
