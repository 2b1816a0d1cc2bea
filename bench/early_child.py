"""A core :class:`Consumer` in a process of its own that notes when each delivery started and
the retry time of each retry it asked for: ``python -m bench.early_child``.

Run by ``bench/early_starts.py`` (two at once, as ``runqueue --processes 2``), from this
checkout or from a base commit's files: it uses only what both have. A message whose payload
has ``retry_ms`` asks for a retry that long after its first attempt (``Retry``). On SIGTERM it
stops and prints one JSON line:

- ``starts``: ``[id, attempt, start (ms, fraction kept), due (ms, its envelope's)]``, the
  start read on the queue's clock as the handler begins (never ahead of the server's, like
  every reading a consumer makes);
- ``retries``: ``[id, the attempt it is the due time of, retry time (ms)]``, read from this
  process's nack calls themselves (nack.lua's ARGV), not from what a claim says.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterable
from typing import Any

import redis

from django_delayqueue.core import Message, Queue, QueueSettings, Retry
from django_delayqueue.core.clock import exact_now_ms
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.scripts.calls import ScriptCall

# nack.lua's ARGV: now, max attempts, horizon, wake channel, then id, token, retry-at (-1: to
# the dead letters), reason for each message.
NACK_FIRST_RETRY_AT, NACK_PER_MESSAGE = 6, 4


class RetryTimes(Queue):
    """A real queue that notes the retry time of every nack sent with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retries: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def nack_call(
        self, failures: Iterable[tuple[Message, float | None, str]], now_ms: int, bury: bool = False
    ) -> ScriptCall:
        failures = list(failures)
        call = super().nack_call(failures, now_ms, bury)
        times = call.args[NACK_FIRST_RETRY_AT::NACK_PER_MESSAGE]
        with self._lock:
            for (m, _, _), at in zip(failures, times, strict=True):
                if int(at) >= 0:
                    self.retries.append((m.id, m.attempt + 1, int(at)))
        return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)

    queue = RetryTimes(
        redis.Redis.from_url(args.url), args.queue, settings=QueueSettings(max_attempts=3)
    )
    starts: list[tuple[str, int, float, int]] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        started = exact_now_ms(queue.clock)
        with lock:
            starts.append((message.id, message.attempt, started, message.due_ms))
        retry_ms = message.payload.get("retry_ms") if isinstance(message.payload, dict) else None
        if retry_ms and message.attempt == 1:
            raise Retry(retry_ms / 1000)

    consumer = Consumer([queue], handler, concurrency=args.concurrency, name="bench-early")
    consumer.install_signal_handlers()
    consumer.run()
    sys.stdout.write(json.dumps({"starts": starts, "retries": queue.retries}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
