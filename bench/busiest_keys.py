"""The busiest flow keys in the stats (issue 27, item 5): what reading them costs Redis, and
that it stays bounded however many keys wait.

    python -m bench --only busiest_keys [--quick]

- ``busiest_keys.us``: Redis time per busiest_keys.lua call (``INFO commandstats``) with
  100,000 keys waiting (one message each; 200 of them with a message in flight), against the
  same with 1,000 keys waiting, in the same run: the read is bounded (the keys in flight and the
  next 100 in turn and waiting), so the ratio stays near 1 (target <= 1.5x). The row's note
  gives counts.lua's time on the same queue, the stats' oldest part, for scale.
"""

from __future__ import annotations

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import BUSIEST_KEYS, COUNTS, SCHEDULE
from django_delayqueue.monitoring.busiest_keys import MAX_STATE_FIELDS, SAMPLE, TOP

from .harness import PAYLOAD_100, Bench, Row, at_most
from .sizes import Sizes

T0 = 1_700_000_000_000
CALLS = 300
IN_FLIGHT = 200


def busiest_keys(bench: Bench, sizes: Sizes) -> list[Row]:
    many = 10_000 if sizes.delivery < 10_000 else 100_000
    measured = {n: _read_cost(bench, n) for n in (many, 1_000)}
    bench.flush()
    (many_us, counts_us), (few_us, _) = measured[many], measured[1_000]
    ratio = many_us / few_us
    return [
        Row(
            "busiest_keys.us",
            f"Redis time per busiest_keys.lua read, {many:,} keys waiting, {IN_FLIGHT} in flight",
            many_us,
            "us",
            few_us,
            f"1,000 keys waiting, {IN_FLIGHT} in flight",
            ratio,
            "<= 1.5x (bounded: does not grow with the keys)",
            at_most(ratio, 1.5),
            note=f"{CALLS} reads each; counts.lua on the same queue: {counts_us:.1f} us",
        )
    ]


def _read_cost(bench: Bench, keys: int) -> tuple[float, float]:
    """Redis microseconds per busiest_keys.lua and per counts.lua call, ``keys`` keys waiting."""
    bench.flush()
    q = Queue(bench.client, "bench-busiest", clock=ManualClock(T0))
    for start in range(0, keys, 1000):
        triples: list[object] = []
        for n in range(start, min(start + 1000, keys)):
            triples += q.prepare(PAYLOAD_100, key=f"key-{n}", now_ms=T0)
        SCHEDULE.call(
            q.keys, now_ms=T0, horizon_ms=0, wake_channel=q.keys.wake_channel, triples=triples
        ).run(q.client)
    q.claim(IN_FLIGHT, now_ms=T0)  # IN_FLIGHT keys with a message in flight
    call = BUSIEST_KEYS.call(q.keys, most_keys=SAMPLE, most_fields=MAX_STATE_FIELDS, top=TOP)
    return _us(bench, call, CALLS), _us(bench, COUNTS.call(q.keys), CALLS)


def _us(bench: Bench, call: ScriptCall, times: int) -> float:
    call.run(bench.client)  # loaded before the count
    bench.client.config_resetstat()
    pipe = bench.client.pipeline(transaction=False)
    for _ in range(times):
        call.run(pipe)
    pipe.execute()
    stats = bench.client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])
