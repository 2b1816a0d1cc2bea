"""What a task's success write costs Redis: write_records.lua per record (issue 37).

    python -m bench.record_writes [--calls 40] [--per-call 200] [--general]

Runs the script a consumer's round sends for its tasks' results (one call per queue and round,
``--per-call`` records each, the shape of a no-op task's success: its start, status, times,
return value and worker) against records as enqueue leaves them, on a redis-server of its own,
and prints Redis's own time per record (``INFO commandstats``: the EVALSHA's microseconds,
the commands inside the script included) and that of the commands inside it. The smallest of
five passes: on a shared host the smallest is the script's, the rest other processes' load.
A success is sent as its compact text (``success_fields``, what a worker sends); ``--general``
sends it as the general write's JSON lists instead, for comparison.
"""

from __future__ import annotations

import argparse
import sys

import redis

from django_delayqueue.core.scripts.contracts import WRITE_RECORDS
from django_delayqueue.core.task_records import success_fields
from django_delayqueue.embedded import RedisServerProcess

PASSES = 5
# A no-op task's success, as tasks/attempt.py writes it (its record has "enqueued" already),
# and as the general write's JSON lists (--general).
COMPACT = success_fields(1796592216129, 1796592216130, "worker:{token}", "host-1234-5f3a9c", "null")
FIELDS = (
    '[["started_at","1796592216129"],["status","SUCCESSFUL","last_attempted_at",'
    '"1796592216129","finished_at","1796592216130","return_value","null"],[],'
    '["worker:{token}","host-1234-5f3a9c"]]'
)
ENQUEUED = '{"task":"bench.djapp.tasks.noop","queue":"bench-tasks","args":[1,2.0,3]}'


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.record_writes", description=__doc__)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--per-call", type=int, default=200)
    p.add_argument("--general", action="store_true", help="the general write's JSON lists")
    args = p.parse_args(argv)
    fields = FIELDS if args.general else COMPACT
    count = args.calls * args.per_call
    best: tuple[float, dict[str, float]] | None = None
    with RedisServerProcess() as server:
        client = redis.Redis.from_url(server.url)
        sha = client.script_load(WRITE_RECORDS.script.source)
        for _ in range(PASSES):
            client.flushdb()
            calls = []
            for c in range(args.calls):
                keys, lines = [], []
                for i in range(args.per_call):
                    key = f"{{dq:bench-tasks}}:task:{c}-{i}-0123456789abcdef"
                    client.hset(key, "enqueued", ENQUEUED)
                    keys.append(key)
                    lines.append(f"86400 3 enqueued {fields.format(token=1)}")
                calls.append((keys, "\n".join(lines)))
            client.config_resetstat()
            for keys, writes in calls:
                reply = client.evalsha(sha, len(keys), *keys, writes)
                if reply[0] != b"1" * len(keys):
                    raise RuntimeError(f"write_records replied {reply[:3]!r}")
            stats = client.info("commandstats")
            total = stats["cmdstat_evalsha"]["usec"] / count
            inside = {
                name.removeprefix("cmdstat_"): s["usec"] / count
                for name, s in stats.items()
                if name != "cmdstat_evalsha" and s["calls"] >= count
            }
            if best is None or total < best[0]:
                best = (total, inside)
    assert best is not None
    inside_text = ", ".join(f"{name} {us:.2f}" for name, us in sorted(best[1].items()))
    print(
        f"write_records.lua{' (general)' if args.general else ''}: {best[0]:.2f} us of Redis "
        f"per record ({args.per_call} a call, "
        f"smallest of {PASSES} passes); of which the commands inside: {inside_text}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
