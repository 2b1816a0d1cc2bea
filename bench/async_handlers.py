"""``async def`` handlers run concurrently: 500 that each ``await asyncio.sleep(1)``.

    python -m bench.async_handlers              # 500 handlers, concurrency 500
    python -m bench.async_handlers --count 200

One ``runqueue`` process per row, on the bench's Django project (bench/djapp/sleepers.py), its
queue at ``concurrency: 500``; the messages are scheduled due at once while it listens. A row
is the time from the schedule to the last handler's end, and the most threads the process had
meanwhile (``/proc/<pid>/status``). The sync row (``time.sleep(1)`` on handler threads) is the
reference, measured in the same run. Target (issue 26): the async row within 3 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess

from .djapp.sleepers import ASYNC_QUEUE, DONE, SYNC_QUEUE
from .harness import Child, wait_until

TARGET_SECONDS = 3.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "async_handlers.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.async_handlers", description=__doc__)
    p.add_argument("--count", type=int, default=500, help="handlers, all due at once")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rows: dict[str, dict[str, Any]] = {}
    with RedisServerProcess() as server, tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        for db, (kind, queue) in enumerate((("async", ASYNC_QUEUE), ("sync", SYNC_QUEUE)), 1):
            url = server.url.rsplit("/", 1)[0] + f"/{db}"
            env = {
                "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
                "BENCH_REDIS_URL": url,
                "BENCH_DB": str(Path(tmp) / f"{db}.sqlite3"),
                "BENCH_SLEEPERS": str(args.count),
            }
            Child(["-m", "django", "migrate", "-v", "0"], env).wait(args.timeout)
            log(f"{kind}: {args.count} handlers that each wait 1 s ...")
            rows[kind] = run(queue, env, redis.Redis.from_url(url), args)
    report(rows, args)
    return 0 if rows["async"]["seconds"] <= TARGET_SECONDS else 1


def run(queue: str, env: dict[str, str], client: redis.Redis, args: argparse.Namespace) -> dict:
    command = ["-m", "django", "runqueue", queue, "--max-messages", str(args.count), "-v", "0"]
    consumer = Child(command, env)
    try:
        q = Queue(client, queue)
        if not wait_until(lambda: client.pubsub_numsub(q.keys.wake_channel)[0][1] > 0, 60):
            raise RuntimeError(f"{queue}: runqueue did not start listening within 60 s")
        most_threads = threads_of(consumer.proc.pid)
        started = time.time()
        q.schedule_many([{"payload": i} for i in range(args.count)])
        deadline = time.monotonic() + args.timeout
        while not client.exists(DONE) and time.monotonic() < deadline:
            most_threads = max(most_threads, threads_of(consumer.proc.pid))
            if consumer.proc.poll() is not None:
                break
            time.sleep(0.02)
        done = client.get(DONE)
        if done is None:
            raise RuntimeError(f"{queue}: the last handler did not end in {args.timeout}s")
        consumer.wait(args.timeout)
    finally:
        consumer.kill()
    return {"seconds": float(done) - started, "most_threads": most_threads}


def threads_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def report(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"{args.count} handlers that each wait 1 s, concurrency {args.count}, one runqueue")
    print("{:<8} {:>10} {:>12}".format("handler", "all done s", "most threads"))
    for kind, r in rows.items():
        print(f"{kind:<8} {r['seconds']:>10.2f} {r['most_threads']:>12}")
    ok = rows["async"]["seconds"] <= TARGET_SECONDS
    print(f"  async all done within {TARGET_SECONDS:g} s: {'ok' if ok else 'MISSED'}")
    out = {"count": args.count, "python": sys.version.split()[0], "rows": rows, "ok": ok}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    log(f"JSON: {args.json}")


def log(text: str) -> None:
    print(f"[async_handlers] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
