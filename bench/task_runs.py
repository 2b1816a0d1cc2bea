"""A task's run on the handler thread, in process: CPU per ``TaskRunner.run`` (issue 37).

    DJANGO_SETTINGS_MODULE=bench.djapp.settings BENCH_TASKS=delayqueue \\
    BENCH_REDIS_URL=redis://127.0.0.1:<port>/0 python -m bench.task_runs own 5000

Enqueues N no-op tasks, due already, each with a ``run_after`` of its own (``own``: a delay
queue's tasks) or none (``none``: ``.enqueue()`` alone, as bench.cost_ab's delivery sends them),
claims them all, then times ``TaskRunner.run`` alone for each (the claims, the acks and the
result writes' round trips left out: their writes are built, not sent). The database at
``BENCH_REDIS_URL`` is emptied first: give it a redis-server of its own. For another tree's
package, put its ``git archive`` first on ``PYTHONPATH`` (this checkout's ``bench`` next); on a
shared host, alternate the trees and compare the smallest figures.

    ... python -m bench.task_runs none 2000 then

A third argument ``then`` times each run with what the consumer calls once Redis has its
result (``WritesWithAck.then``: a success's ``task_finished``, or its check), over the same
deliveries again and again (12 passes), and prints the smallest of the passes' slices of 250
runs: on a loaded host the slice that nothing else interrupted.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any


def main(argv: list[str]) -> int:
    import django

    django.setup()
    import django_delayqueue
    from django_delayqueue.conf.queues import get_queue
    from django_delayqueue.tasks import runner

    from .djapp.settings import TASK_QUEUE
    from .djapp.tasks import noop

    mode, count = argv[0], int(argv[1])
    q = get_queue(TASK_QUEUE)
    q.client.flushdb()
    afters = run_afters(count, datetime.now(timezone.utc))
    for i, after in enumerate(afters):
        task = noop.using(run_after=after) if mode == "own" else noop
        task.enqueue(i, 0.0, count - 1)
    deliveries: list = []
    while len(deliveries) < count:
        claimed = q.claim(500)
        if not claimed:  # what was enqueued is not all due: waiting would not end it
            print(f"only {len(deliveries)} of {count} tasks could be claimed", file=sys.stderr)
            return 1
        deliveries += claimed
    run = runner.TaskRunner("bench", write_soon=lambda queue, call: None).run
    where = os.path.dirname(os.path.dirname(django_delayqueue.__file__))
    if argv[2:] == ["then"]:
        best = min(_slice_cpu(run, deliveries[i : i + 250], q) for _ in range(12)
                   for i in range(0, count, 250))  # fmt: skip
        print(f"{where} {mode}: {best * 1e6:.2f} us of CPU per task run and its then()")
        return 0
    cpu = 0.0
    for delivery in deliveries:
        started = time.process_time()
        run(delivery, q)
        cpu += time.process_time() - started
    print(f"{where} {mode}: {cpu / count * 1e6:.1f} us of CPU per task run")
    return 0


def run_afters(count: int, now: datetime) -> list[datetime]:
    """A ``run_after`` of its own for each of ``count`` tasks, one millisecond apart and all
    already due: counted back from a minute ago (counted forward, the 60,001st was in the
    future, and the claims waited for it: a run of more than 60,000 never ended)."""
    due = now - timedelta(seconds=60)
    return [due - timedelta(milliseconds=i) for i in range(count)]


def _slice_cpu(run: Any, deliveries: list[Any], q: Any) -> float:
    """CPU per task of running ``deliveries`` and their ``then`` (Redis replied 1: written)."""
    started = time.process_time()
    for delivery in deliveries:
        run(delivery, q).then(1)
    return (time.process_time() - started) / len(deliveries)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
