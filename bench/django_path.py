"""End-to-end Django row: a view calls ``dq.schedule``, ``runqueue`` sends it to a receiver.

Both sides are child processes on ``bench.djapp.settings``: the producer drives the view with
Django's test client (URL routing, the view, ``dq.schedule``; no HTTP server in between), one
request after another; ``manage.py runqueue`` delivers to a signal receiver that writes the
time once, when the last message arrives. Messages are due at once, so the rate is bounded by
the slower of the two sides.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from django_delayqueue.core import Queue

from .harness import Bench, Child, Row, wait_until
from .sizes import Sizes

QUEUE = "bench-e2e"


def django_path(bench: Bench, sizes: Sizes) -> list[Row]:
    count = sizes.django_path
    with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        env = {
            "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
            "BENCH_REDIS_URL": bench.url,
            "BENCH_DB": str(Path(tmp) / "bench.sqlite3"),
            "BENCH_E2E_COUNT": str(count + 1),  # the producer's warm-up request is one more
        }
        Child(["-m", "django", "migrate", "-v", "0"], env).wait(sizes.timeout)
        consumer = Child(
            ["-m", "django", "runqueue", QUEUE, "--max-messages", str(count + 1), "-v", "0"],
            env,
        )
        try:
            channel = Queue(bench.client, QUEUE).keys.wake_channel
            if not wait_until(lambda: bench.client.pubsub_numsub(channel)[0][1] > 0, 60):
                raise RuntimeError("runqueue did not start listening within 60 s")
            out, _ = Child(["-m", "bench.djapp.produce", str(count)], env).wait(sizes.timeout)
            produced = json.loads(out.strip().splitlines()[-1])
            consumer.wait(sizes.timeout)
        finally:
            consumer.kill()
    done = float(bench.client.get("bench:e2e:done") or 0)
    left = Queue(bench.client, QUEUE).counts()
    bench.flush()
    requests_per_s = count / (produced["elapsed_ns"] / 1e9)
    end_to_end = count / (done - produced["started"]) if done > produced["started"] else None
    return [
        Row(
            "django.requests",
            f"view -> dq.schedule, test client, {count:,} requests one after another",
            requests_per_s,
            "req/s",
            target="reported",
        ),
        Row(
            "django.e2e",
            "view -> dq.schedule -> runqueue -> receiver, messages/s",
            end_to_end,
            "msg/s",
            target="reported",
            ok=None if not any(left.values()) else False,
            note="" if not any(left.values()) else f"left in Redis: {left}",
            extra={"finished_at": done, "first_request_at": produced["started"]},
        ),
    ]
