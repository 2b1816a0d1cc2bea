"""Flow keys (issue 27, item 2): fairness between keys, what a claim costs with many keys, and
what keys cost a queue that has none.

    python -m bench --only flow_keys [--quick]

- ``flow_keys.fairness``: one key with 50,000 messages due and 100 keys with one each (due
  after them), claims of 10: how many claims until every single message has started, against
  the same messages without keys (one FIFO list) in the same run. Target: one claim round,
  ceil(101 / 10) = 11 claims.
- ``flow_keys.claim_us.many_keys``: Redis time per claim of 10 (``INFO commandstats``) with
  100,000 keys waiting (one message each) against 10 keys waiting (10,000 each), the same
  100,000 messages: within 2x (O(log n) per claimed message in the number of keys).
- ``flow_keys.claim_us.b1`` / ``.b100`` and ``flow_keys.ack_us``: Redis time per claim (of 1,
  of 100) and per ack of 100 on a queue without keyed messages, claim.lua and ack.lua as now
  against the scripts of the commit before flow keys (``git show $BENCH_KEYS_BASE_REF:…``,
  default ``53e8304``), interleaved rounds on the same ready list: what keys cost a queue that
  does not use them.
"""

from __future__ import annotations

import math
import os
import statistics

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.envelope import ENVELOPE_FORMAT
from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.contracts import ACK, CLAIM, SCHEDULE

from .base_scripts import script_at
from .harness import PAYLOAD_100, Bench, Row, at_most
from .sizes import Sizes

BASE_REF = "53e8304"  # main before flow keys
T0 = 1_700_000_000_000


def flow_keys(bench: Bench, sizes: Sizes) -> list[Row]:
    quick = sizes.delivery < 10_000
    rows = [fairness(bench, 5_000 if quick else 50_000)]
    rows.append(many_keys_claim_cost(bench, 10_000 if quick else 100_000))
    rows += unkeyed_cost(bench, sizes)
    return rows


def _queue(bench: Bench, name: str) -> Queue:
    return Queue(bench.client, name, clock=ManualClock(T0))


def _schedule_keyed(q: Queue, items: list[tuple[object, str | None]]) -> None:
    """Due now, in order, in calls of 1000 (schedule_many takes no key yet)."""
    for start in range(0, len(items), 1000):
        triples: list[object] = []
        for payload, key in items[start : start + 1000]:
            triples += q.prepare(payload, key=key, now_ms=T0)
        SCHEDULE.call(
            q.keys, now_ms=T0, horizon_ms=0, wake_channel=q.keys.wake_channel, triples=triples
        ).run(q.client)


def _claims_until_singles(q: Queue, singles: set[str]) -> int:
    claims = 0
    while singles:
        taken = q.claim(10, now_ms=T0)
        claims += 1
        singles -= {m.id for m in taken}
        if not taken:
            raise RuntimeError("flow_keys: a claim took nothing while singles wait")
    return claims


def fairness(bench: Bench, hot: int) -> Row:
    measured = {}
    for keyed in (True, False):
        bench.flush()
        q = _queue(bench, "bench-keys-fair")
        items = [(PAYLOAD_100, "hot" if keyed else None) for _ in range(hot)]
        _schedule_keyed(q, items)
        singles_items = [({"k": k}, f"store-{k}" if keyed else None) for k in range(100)]
        before = set(q.client.hkeys(q.keys.messages))
        _schedule_keyed(q, singles_items)
        singles = {i.decode() for i in set(q.client.hkeys(q.keys.messages)) - before}
        measured[keyed] = _claims_until_singles(q, singles)
    bench.flush()
    target = math.ceil(101 / 10)
    return Row(
        "flow_keys.fairness",
        f"claims of 10 until 100 single-message keys all started, one key {hot:,} due first",
        measured[True],
        "claims",
        measured[False],
        "the same messages without keys (one FIFO list)",
        measured[True] / measured[False],
        f"<= {target} claims (one round)",
        at_most(measured[True], target),
    )


def _claim_cost_us(bench: Bench, q: Queue, claims: int) -> float:
    client = bench.client
    client.config_resetstat()
    for start in range(0, claims, 100):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(100, claims - start)):
            CLAIM.call(
                q.keys,
                now_ms=T0,
                deadline_ms=T0 + 60_000,
                most_ids=10,
                limits="",
                reads_format=ENVELOPE_FORMAT,
            ).run(pipe)
        pipe.execute()
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])


def many_keys_claim_cost(bench: Bench, messages: int) -> Row:
    claims = 500
    measured = {}
    for nkeys in (messages, 10):
        bench.flush()
        q = _queue(bench, "bench-keys-cost")
        per_key = messages // nkeys
        _schedule_keyed(q, [(PAYLOAD_100, f"key-{n % nkeys}") for n in range(nkeys * per_key)])
        q.claim(1, now_ms=T0)  # scripts loaded, the rotation set up
        measured[nkeys] = _claim_cost_us(bench, q, claims)
    bench.flush()
    ratio = measured[messages] / measured[10]
    return Row(
        "flow_keys.claim_us.many_keys",
        f"Redis time per claim of 10 with {messages:,} keys waiting (one message each)",
        measured[messages],
        "us",
        measured[10],
        f"10 keys waiting ({messages // 10:,} messages each)",
        ratio,
        "<= 2x",
        at_most(ratio, 2.0),
        note=f"{claims} claims each; server time from INFO commandstats",
    )


# --- what keys cost a queue without them -----------------------------------------------------


def _base_script(name: str) -> LuaScript | None:
    """``name``.lua at the base ref (None when it has flow keys already)."""
    return script_at(os.environ.get("BENCH_KEYS_BASE_REF", BASE_REF), name, "key_")


def _us_per_call(bench: Bench) -> float:
    stats = bench.client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / int(stats["calls"])


def _claim_and_ack_us(
    bench: Bench, claim: LuaScript, ack: LuaScript, base: bool, batch: int, n: int
) -> tuple[float, float]:
    """Redis microseconds per claim of ``batch`` (claiming ``n`` ready messages) and per ack
    of 100 of them."""
    bench.flush()
    q = _queue(bench, "bench-keys-unkeyed")
    for start in range(0, n, 10_000):
        q.schedule_many([{"payload": PAYLOAD_100} for _ in range(min(10_000, n - start))])
    client = bench.client
    claim_keys = CLAIM.keys_for(q.keys)
    ack_keys = ACK.keys_for(q.keys)
    if base:
        claim_keys, ack_keys = claim_keys[:12], ack_keys[:12]
    for script in (claim, ack):
        client.script_load(script.source)
    client.config_resetstat()
    replies = []
    calls = n // batch
    for start in range(0, calls, 100):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(100, calls - start)):
            args = [T0, T0 + 60_000, batch, ""] + ([] if base else [ENVELOPE_FORMAT])
            pipe.execute_command("EVALSHA", claim.sha, len(claim_keys), *claim_keys, *args)
        replies += pipe.execute()
    claim_us = _us_per_call(bench)
    pairs = [part for reply in replies for i in range(0, len(reply), 4) for part in
             (reply[i], reply[i + 3])]  # fmt: skip
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(pairs), 200):
        args = [T0, 0, q.keys.wake_channel, *pairs[start : start + 200]]
        pipe.execute_command("EVALSHA", ack.sha, len(ack_keys), *ack_keys, *args)
    pipe.execute()
    return claim_us, _us_per_call(bench)


def unkeyed_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    claim_base, ack_base = _base_script("claim"), _base_script("ack")
    ref = os.environ.get("BENCH_KEYS_BASE_REF", BASE_REF)
    bases = claim_base is not None and ack_base is not None  # else ours are measured alone
    messages = max(2000, sizes.delivery // 10)
    rows = []
    ack_ratios, ack_ours, ack_theirs = [], [], []
    for batch in (1, 100):
        ratios, ours, theirs = [], [], []
        for round_ in range(sizes.rounds):
            measured = {}
            for base in (False, True) if round_ % 2 else (True, False):
                if base and not bases:
                    continue
                scripts = (claim_base, ack_base) if base else (CLAIM.script, ACK.script)
                measured[base] = _claim_and_ack_us(bench, *scripts, base, batch, messages)
            ours.append(measured[False][0])
            if batch == 100:
                ack_ours.append(measured[False][1])
            if bases:
                theirs.append(measured[True][0])
                ratios.append(measured[False][0] / measured[True][0])
                if batch == 100:
                    ack_theirs.append(measured[True][1])
                    ack_ratios.append(measured[False][1] / measured[True][1])
        ratio = statistics.median(ratios) if ratios else None
        rows.append(
            Row(
                f"flow_keys.claim_us.b{batch}",
                f"Redis time per claim of {batch}, no keyed message, {messages:,} ready",
                statistics.median(ours),
                "us",
                statistics.median(theirs) if theirs else None,
                f"claim.lua of {ref} (before flow keys)" if bases else f"no base at {ref}",
                ratio,
                "<= 1.10x base (one HLEN)",
                at_most(ratio, 1.10),
                note="median of interleaved rounds; server time from INFO commandstats",
            )
        )
    ack_ratio = statistics.median(ack_ratios) if ack_ratios else None
    rows.append(
        Row(
            "flow_keys.ack_us",
            "Redis time per ack of 100, no keyed message",
            statistics.median(ack_ours),
            "us",
            statistics.median(ack_theirs) if ack_theirs else None,
            f"ack.lua of {ref} (before flow keys)" if bases else f"no base at {ref}",
            ack_ratio,
            "<= 1.10x base",
            at_most(ack_ratio, 1.10),
            note="median of interleaved rounds; server time from INFO commandstats",
        )
    )
    bench.flush()
    return rows
