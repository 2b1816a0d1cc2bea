"""The busiest flow keys in the stats (issue 27, item 5): what reading them costs Redis, and
that it stays bounded however many keys wait.

    python -m bench --only busiest_keys [--quick]

- ``busiest_keys.us``: Redis time per busiest_keys.lua call (``INFO commandstats``) with
  100,000 keys waiting (one message each; 200 of them with a message in flight), against the
  same with 1,000 keys waiting, in the same run: the read is one ZREVRANGE of key_load and a
  split per key shown, exact and bounded, so the ratio stays near 1 (target <= 1.5x). The row's note
  gives counts.lua's time on the same queue, the stats' oldest part, for scale.
- ``busiest_keys.keyed_ack_us``: what keeping key_load (the exact top's sorted set) costs a
  keyed queue: Redis time per ack of 100 keyed messages (100 keys), ack.lua as now against
  ack.lua and its includes at the commit before key_load (``$BENCH_KEY_LOAD_BASE_REF``, default
  ``a10d712``), interleaved rounds on the same messages (target <= 1.10x: one ZINCRBY per
  message acked).
"""

from __future__ import annotations

import hashlib
import os
import re
import statistics
import subprocess

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.scripts.calls import LuaScript, ScriptCall
from django_delayqueue.core.scripts.contracts import ACK, BUSIEST_KEYS, SCHEDULE
from django_delayqueue.monitoring.busiest_keys import TOP

from .harness import PAYLOAD_100, ROOT, Bench, Row, at_most
from .sizes import Sizes

T0 = 1_700_000_000_000
CALLS = 300
IN_FLIGHT = 200
KEY_LOAD_BASE_REF = "a10d712"  # main before key_load (review fixes included)
LUA = "django_delayqueue/core/scripts/lua"
_INCLUDE = re.compile(r'^--- @include "([\w./-]+\.lua)"[ \t]*$', re.MULTILINE)


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
        ),
        keyed_ack_cost(bench, sizes.rounds),
    ]


def keyed_ack_cost(bench: Bench, rounds: int) -> Row:
    ref = os.environ.get("BENCH_KEY_LOAD_BASE_REF", KEY_LOAD_BASE_REF)
    base = _script_at(ref, "ack")
    ours, theirs, ratios = [], [], []
    for round_ in range(rounds):
        measured = {}
        for with_load in (True, False) if round_ % 2 else (False, True):
            if not with_load and base is None:
                continue
            measured[with_load] = _keyed_ack_us(bench, ACK.script if with_load else base)
        ours.append(measured[True])
        if base is not None:
            theirs.append(measured[False])
            ratios.append(measured[True] / measured[False])
    bench.flush()
    ratio = statistics.median(ratios) if ratios else None
    return Row(
        "busiest_keys.keyed_ack_us",
        "Redis time per ack of 100 keyed messages (100 keys), key_load kept",
        statistics.median(ours),
        "us",
        statistics.median(theirs) if theirs else None,
        f"ack.lua of {ref} (before key_load)" if base else f"no base at {ref}",
        ratio,
        "<= 1.10x base (one ZINCRBY per message)",
        at_most(ratio, 1.10),
        note="median of interleaved rounds; server time from INFO commandstats",
    )


def _keyed_ack_us(bench: Bench, ack: LuaScript | None) -> float:
    """Redis microseconds per ack of 100 keyed messages, one of each of 100 keys, by ``ack``
    (a base script takes the keys before key_load)."""
    assert ack is not None
    bench.flush()
    q = Queue(bench.client, "bench-key-load", clock=ManualClock(T0))
    for start in range(0, 10_000, 1000):
        triples: list[object] = []
        for n in range(start, start + 1000):
            triples += q.prepare(PAYLOAD_100, key=f"key-{n % 100}", now_ms=T0)
        SCHEDULE.call(
            q.keys, now_ms=T0, horizon_ms=0, wake_channel=q.keys.wake_channel, triples=triples
        ).run(q.client)
    keys = [k for k in ACK.keys_for(q.keys) if ack is ACK.script or k != q.keys.key_load]
    client = bench.client
    client.script_load(ack.source)
    client.config_resetstat()
    for _ in range(100):
        pairs = [part for m in q.claim(100, now_ms=T0) for part in (m.id, m.token)]
        client.execute_command("EVALSHA", ack.sha, len(keys), *keys, T0, 0, "-", *pairs)
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])


def _script_at(ref: str, name: str) -> LuaScript | None:
    """``name``.lua with its includes, all as they were at ``ref`` (None: not there)."""
    included: set[str] = set()

    def read(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{ref}:{LUA}/{path}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def include(match: re.Match[str]) -> str:
        target = match.group(1)
        if target in included:
            return ""
        included.add(target)
        return _INCLUDE.sub(include, read(target)).rstrip("\n")

    try:
        source = _INCLUDE.sub(include, read(f"{name}.lua"))
    except (OSError, subprocess.CalledProcessError):
        return None
    return LuaScript(f"{name}@{ref}", source, hashlib.sha1(source.encode()).hexdigest())


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
    call = BUSIEST_KEYS.call(q.keys, top=TOP)
    return _us(bench, call, CALLS), _us(bench, q.counts_call(T0), CALLS)


def _us(bench: Bench, call: ScriptCall, times: int) -> float:
    call.run(bench.client)  # loaded before the count
    bench.client.config_resetstat()
    pipe = bench.client.pipeline(transaction=False)
    for _ in range(times):
        call.run(pipe)
    pipe.execute()
    stats = bench.client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])
