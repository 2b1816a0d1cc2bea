"""The same measurements for a Python peer a Django user would otherwise pick: huey (RedisHuey).

huey moves due tasks from its schedule to its queue in a scheduler thread that runs once a
second (its minimum interval), so its lateness is expected in the hundreds of milliseconds.
"""

from __future__ import annotations

import random
import time

from django_delayqueue.core import Queue

from .deliver import report_of, schedule_due_at_once
from .harness import Bench, Child, Row, interleave, percentile
from .huey_child import make_huey
from .produce import messages, schedule_calls
from .raw import Raw
from .sizes import Sizes


def huey(bench: Bench, sizes: Sizes) -> list[Row]:
    return [*_schedule(bench, sizes), *_delivery(bench, sizes), *_lateness(bench, sizes)]


def _schedule(bench: Bench, sizes: Sizes) -> list[Row]:
    _, noop = make_huey(bench.url)
    items = messages(sizes.peer_schedule, seed=5)
    share = sizes.peer_schedule // sizes.rounds

    def theirs(r: int) -> int:
        for item in items[r * share : (r + 1) * share]:
            noop.schedule(args=(0,), delay=item["delay"])
        return share

    ours = schedule_calls(Queue(bench.client, "bench-peer"), items, sizes.rounds)
    result = interleave(sizes.rounds, theirs, ours, Raw(bench.client).evalsha_one(share))
    theirs_rate, ours_rate, raw_rate = result.rates
    bench.flush()
    return [
        Row(
            "peer.huey.schedule",
            f"huey: task.schedule(), one call per message ({sizes.peer_schedule:,})",
            theirs_rate,
            "msg/s",
            ours_rate,
            "our schedule() in the same rounds",
            result.ratio,
            "reported (ours should be higher)",
            note=f"raw EVALSHA {raw_rate:,.0f}/s",
        )
    ]


def _delivery(bench: Bench, sizes: Sizes) -> list[Row]:
    _, noop = make_huey(bench.url)
    count = sizes.peer_delivery
    lead = 2.0 + count / 5000
    due_ms = int((time.time() + lead) * 1000)
    for _ in range(count):
        noop.schedule(args=(due_ms,), delay=due_ms / 1000 - time.time())
    time.sleep(max(0.0, due_ms / 1000 - time.time()))
    child = Child(["-m", "bench.huey_child", "--url", bench.url, "--count", str(count)])
    theirs = report_of(child.wait(sizes.timeout)[0])
    bench.flush()

    queue = Queue(bench.client, "bench-peer-deliver")
    schedule_due_at_once(queue, count, {"order": 1})
    child = Child(
        [
            "-m",
            "bench.consumer_child",
            "--url",
            bench.url,
            "--queue",
            queue.name,
            "--count",
            str(count),
        ]
    )
    ours = report_of(child.wait(sizes.timeout)[0])
    bench.flush()
    theirs_rate = count / (theirs["elapsed_ns"] / 1e9)
    ours_rate = count / (ours["elapsed_ns"] / 1e9)
    return [
        Row(
            "peer.huey.deliver",
            f"huey: delivery, {count:,} due at once, 1 worker thread",
            theirs_rate,
            "msg/s",
            ours_rate,
            "our consumer, same count, concurrency 1",
            theirs_rate / ours_rate,
            "reported (ours should be higher)",
            ok=None if theirs["finished"] else False,
        )
    ]


def _lateness(bench: Bench, sizes: Sizes) -> list[Row]:
    _, noop = make_huey(bench.url)
    count = sizes.peer_lateness
    child = Child(["-m", "bench.huey_child", "--url", bench.url, "--count", str(count)])
    time.sleep(1.0)  # let it start; huey has no "listening" signal to wait for
    rng = random.Random(6)
    start = time.time() * 1000 + 500
    window = int(sizes.peer_lateness_seconds * 1000)
    for due in sorted(start + rng.randrange(window) for _ in range(count)):
        noop.schedule(args=(due, True), delay=due / 1000 - time.time())
    report = report_of(child.wait(sizes.timeout + sizes.peer_lateness_seconds)[0])
    bench.flush()
    late = report["lateness_ms"]
    spec = f"{count:,} over {sizes.peer_lateness_seconds:g} s"
    return [
        Row("peer.huey.lateness.p50", f"huey: lateness p50 ({spec})", percentile(late, 50), "ms",
            target="reported"),
        Row("peer.huey.lateness.p99", f"huey: lateness p99 ({spec})", percentile(late, 99), "ms",
            target="reported"),
        Row("peer.huey.lateness.max", f"huey: lateness max ({spec})", max(late), "ms",
            target="reported"),
    ]  # fmt: skip
