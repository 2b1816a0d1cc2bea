"""A core :class:`Consumer` in a process of its own, for fault drills (kill it, stop it, ...).

Run as ``python tests/support/programs/fault_consumer.py --url URL --queue NAME [--ledger PATH]
...``. The handler records every delivery in the ledger (``tests/support/ledger.py``) before it
does anything, then does what the message's payload asks (``{"do": "raise" | "exit" | "kill" |
"sleep:S"}``) or, failing that, what ``--mode`` says. ``--fail-rate`` / ``--exit-rate`` make a
random share of deliveries raise or end the process (the soak uses them), recorded as such in the
ledger.

``--counts-dir`` replaces the file ledger with an in-memory tally written as JSON when the
process stops: the eight-consumer race over 100,000 messages needs no per-delivery fsync.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for `ledger` when run by path

from ledger import EXIT, OK, RAISE, Ledger

from django_delayqueue.core import Message, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer

# The Django layer's defaults (connection.py), so the drills exercise the same client setup.
CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 30,
    "socket_keepalive": True,
    "health_check_interval": 30,
}


class DrillHandler:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ledger = Ledger(args.ledger, fsync=not args.no_fsync) if args.ledger else None
        self.random = random.Random(args.seed if args.seed is not None else os.getpid())
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.early = 0

    def action(self, message: Message) -> str:
        payload = message.payload
        if isinstance(payload, dict) and isinstance(payload.get("do"), str):
            return payload["do"]
        with self.lock:
            roll = self.random.random()
        if roll < self.args.exit_rate:
            return "exit"
        if roll < self.args.exit_rate + self.args.fail_rate:
            return "raise"
        return self.args.mode

    def __call__(self, message: Message) -> None:
        action = self.action(message)
        kind = {"raise": RAISE, "exit": EXIT, "kill": EXIT}.get(action, OK)
        if self.ledger is not None:
            self.ledger.record(message.id, message.due_ms, message.attempt, kind)
        else:
            with self.lock:
                self.counts[message.id] += 1
                if int(time.time() * 1000) + 1 < message.due_ms:
                    self.early += 1
        if action == "raise":
            raise RuntimeError(f"drill: failing attempt {message.attempt}")
        if action == "exit":
            os._exit(3)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))

    def dump_counts(self) -> None:
        if self.args.counts_dir:
            path = Path(self.args.counts_dir) / f"{os.getpid()}.json"
            path.write_text(json.dumps({"counts": self.counts, "early": self.early}))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--queue", action="append", required=True)
    p.add_argument("--prefix", default="dq")
    p.add_argument("--ledger")
    p.add_argument("--no-fsync", action="store_true")
    p.add_argument("--counts-dir")
    p.add_argument("--mode", default="ok", help="ok | raise | exit | kill | sleep:SECONDS")
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--exit-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--visibility", type=float, default=2.0)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--backoff-base", type=float, default=0.05)
    p.add_argument("--backoff-max", type=float, default=0.5)
    p.add_argument("--claim-batch", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--burst", action="store_true")
    p.add_argument("--max-messages", type=int)
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--maintenance", type=float, default=0.5)
    p.add_argument("--cluster", action="store_true", help="--url is a Redis Cluster node")
    p.add_argument("--socket-timeout", type=float, default=CLIENT_OPTIONS["socket_timeout"])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    options = {**CLIENT_OPTIONS, "socket_timeout": args.socket_timeout}
    if args.cluster:
        from redis.cluster import RedisCluster

        client: Any = RedisCluster.from_url(args.url, **options)
    else:
        client = redis.Redis.from_url(args.url, **options)
    settings = QueueSettings(
        max_attempts=args.max_attempts,
        visibility_timeout=args.visibility,
        backoff_base=args.backoff_base,
        backoff_max=args.backoff_max,
        claim_batch=args.claim_batch,
    )
    queues = [Queue(client, name, prefix=args.prefix, settings=settings) for name in args.queue]
    handler = DrillHandler(args)
    consumer = Consumer(
        queues,
        handler,
        concurrency=args.concurrency,
        burst=args.burst,
        max_messages=args.max_messages,
        grace_seconds=args.grace,
        maintenance_seconds=args.maintenance,
        idle_seconds=0.5,
    )
    consumer.install_signal_handlers()
    try:
        return consumer.run()
    finally:
        handler.dump_counts()


if __name__ == "__main__":
    sys.exit(main())
