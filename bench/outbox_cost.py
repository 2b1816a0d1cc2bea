"""What the transactional outbox costs a view that schedules one message per request.

``bench.djapp.outbox_view`` times a checkout view (an order row and its close-order message in
one transaction) three ways, interleaved: the insert alone, ``dq.schedule`` without the outbox,
and with it (an outbox row written in the transaction, deleted after the send). On SQLite, and
on the local PostgreSQL when one answers on 127.0.0.1:5432 (the bench creates and drops its
database). The figure is the median over rounds of microseconds per request.
"""

from __future__ import annotations

import statistics

from .databases import measure_per_database
from .harness import Bench, Row
from .sizes import Sizes


def outbox_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    program = ["bench.djapp.outbox_view", str(sizes.outbox_requests), str(sizes.rounds)]
    measured = measure_per_database(bench, sizes, program, "dq_bench_outbox")
    return [row for name, got in measured.items() for row in _rows(name, got["modes"], sizes)]


def _rows(database: str, modes: dict[str, list[float]], sizes: Sizes) -> list[Row]:
    insert = statistics.median(modes["insert only"])
    without = statistics.median(modes["without outbox"])
    with_outbox = statistics.median(modes["with outbox"])
    ratios = [w / o for w, o in zip(modes["with outbox"], modes["without outbox"], strict=True)]
    what = f"checkout view on {database}, {sizes.outbox_requests:,} requests x {sizes.rounds}"
    return [
        Row(
            f"outbox.{database}.without",
            f"{what}: order row + dq.schedule, OUTBOX=False",
            without,
            "us/req",
            baseline=insert,
            baseline_what="the order row alone",
            ratio=without / insert,
            target="reported",
        ),
        Row(
            f"outbox.{database}.with",
            f"{what}: order row + dq.schedule, OUTBOX=True",
            with_outbox,
            "us/req",
            baseline=without,
            baseline_what="OUTBOX=False",
            ratio=statistics.median(ratios),
            target="reported",
            note=f"the outbox adds {with_outbox - without:.0f} us per request",
        ),
    ]
