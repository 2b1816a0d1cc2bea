"""What an atomic queue (docs/exactly-once.md) costs per message, beside the same handler on a
queue that is not atomic, in the same run.

``bench.djapp.atomic_handler`` delivers messages whose handler inserts one row in a
transaction, with and without the mode, interleaved round by round (the order alternating);
the mode adds the inbox row's INSERT to a transaction the handler needed anyway. On SQLite,
and on the local PostgreSQL when one answers on 127.0.0.1:5432 (a database created and dropped
here). Each figure is the median over ``sizes.atomic_rounds`` rounds of microseconds per
delivered message; the cost is the median of the per-round differences (each round's two
bursts ran back to back, so a noisy second of the machine hits both alike).
"""

from __future__ import annotations

import statistics

from .databases import modes_per_database
from .harness import Bench, Row
from .sizes import Sizes


def atomic_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    program = [
        "bench.djapp.atomic_handler",
        str(sizes.atomic_messages),
        str(sizes.atomic_rounds),
    ]
    measured = modes_per_database(bench, sizes, program, "dq_bench_atomic")
    return [_row(name, modes, sizes) for name, modes in measured.items()]


def _row(database: str, modes: dict[str, list[float]], sizes: Sizes) -> Row:
    plain, atomic = modes["plain"], modes["atomic"]
    ratios = [a / p for a, p in zip(atomic, plain, strict=True)]
    differences = [a - p for a, p in zip(atomic, plain, strict=True)]
    cost = statistics.median(differences)
    return Row(
        f"atomic.{database}",
        f"a handler inserting one row in a transaction on {database}, "
        f"{sizes.atomic_messages:,} messages x {sizes.atomic_rounds} rounds: atomic queue",
        statistics.median(atomic),
        "us/msg",
        baseline=statistics.median(plain),
        baseline_what="the same handler, queue not atomic",
        ratio=statistics.median(ratios),
        target="reported",
        note=(
            f"the inbox row adds {cost:.0f} us per message (median of per-round differences; "
            f"rounds: {_spread(differences)})"
        ),
        extra={
            "plain_us": plain,
            "atomic_us": atomic,
            "difference_us": differences,
            "cost_us": cost,
        },
    )


def _spread(values: list[float]) -> str:
    return ", ".join(f"{v:+.0f}" for v in values)
