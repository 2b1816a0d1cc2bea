"""``python -m bench.djapp.produce N``: N requests to the scheduling view via the test client."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.djapp.settings")
    import django

    django.setup()
    from django.test import Client

    count = int(sys.argv[1])
    client = Client()
    assert client.get("/schedule/0/").status_code == 200  # warm: URL resolver, Redis, scripts
    started = time.time()
    t0 = time.perf_counter_ns()
    for n in range(1, count + 1):
        response = client.get(f"/schedule/{n}/")
        if response.status_code != 200:
            raise SystemExit(f"request {n}: HTTP {response.status_code}")
    elapsed_ns = time.perf_counter_ns() - t0
    sys.stdout.write(json.dumps({"started": started, "elapsed_ns": elapsed_ns}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
