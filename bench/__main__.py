"""``python -m bench``: measure the engine against raw Redis (and huey), print, write JSON.

python -m bench                 # the full run (~10 minutes on two cores)
python -m bench --quick         # a smoke run of a few seconds, tiny sizes
python -m bench --only deliver,lateness --no-peers
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.utils import HIREDIS_AVAILABLE

from . import (
    atomic_cost,
    backlog,
    busiest_keys,
    claim_ahead,
    deliver,
    django_path,
    early_starts,
    flow_keys,
    lateness_cost,
    lua_loading,
    outbox_cost,
    peers,
    processes,
    produce,
    progress_cost,
    rate_limit,
    tracing,
    unique,
)
from .harness import Bench, Row, private_redis
from .report import table, write_json
from .sizes import Sizes, sizes_for

SECTIONS: dict[str, Callable[[Bench, Sizes], list[Row]]] = {
    "schedule": produce.schedule_one,
    "schedule_many": produce.schedule_many,
    "deliver": deliver.throughput,
    "lateness": deliver.lateness,
    "lateness_slow": deliver.lateness_beside_slow,
    "idle": deliver.idle,
    "backlog": backlog.backlog,
    "django": django_path.django_path,
    "outbox": outbox_cost.outbox_cost,
    "atomic": atomic_cost.atomic_cost,
    "peers": peers.huey,
    "lua_loading": lua_loading.lua_loading,
    "processes": processes.supervised_beside_in_process,
    "processes_cpu": processes.cpu_bound,
    "claim_ahead": claim_ahead.cpu_split,
    "claim_ahead_noop": claim_ahead.noop_delivery_and_lateness,
    "rate_limit": rate_limit.rate_limit,
    "unique": unique.schedule_unique,
    "tracing": tracing.tracing,
    "lateness_cost": lateness_cost.lateness_cost,
    "flow_keys": flow_keys.flow_keys,
    "busiest_keys": busiest_keys.busiest_keys,
    "progress": progress_cost.progress_cost,
    "early": early_starts.early_starts,
}
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of seconds")
    p.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure huey (default: on for the full run, off with --quick)",
    )
    p.add_argument("--backlog", type=int, default=None, help="pending messages (default 5M)")
    p.add_argument("--only", default="", help=f"comma-separated sections: {', '.join(SECTIONS)}")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sizes = sizes_for(args.quick, args.backlog)
    peers_on = (not args.quick) if args.peers is None else args.peers
    chosen = [s for s in args.only.split(",") if s] or [
        s for s in SECTIONS if s != "peers" or peers_on
    ]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        print(f"unknown section(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2

    rows: list[Row] = []
    timings: dict[str, float] = {}
    with private_redis() as bench:
        for name in chosen:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            started = time.monotonic()
            rows += SECTIONS[name](bench, sizes)
            timings[name] = round(time.monotonic() - started, 1)
            bench.flush()
    parser = "hiredis" if HIREDIS_AVAILABLE else "pure-Python (pip install hiredis for more)"
    print(f"redis-py {redis.__version__}, {parser} parser; {os.cpu_count()} CPUs\n")
    print(table(rows))
    meta = {
        "quick": args.quick,
        "hiredis": HIREDIS_AVAILABLE,
        "sizes": sizes.__dict__,
        "section_seconds": timings,
        "cpus": os.cpu_count(),
    }
    write_json(args.json, rows, meta)
    print(f"\nJSON: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
