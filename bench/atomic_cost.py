"""What an atomic queue (docs/exactly-once.md) costs per message, beside the same handler on a
queue that is not atomic, in the same run.

``bench.djapp.atomic_handler`` delivers messages whose handler inserts one row in a
transaction, with and without the mode, interleaved slice by slice (200 messages a slice, the
order alternating); the mode adds the inbox row's INSERT to a transaction the handler needed
anyway. On SQLite, and on the local PostgreSQL when one answers on 127.0.0.1:5432 (a database
created and dropped here). Each figure is the median over ``sizes.atomic_rounds`` rounds of
microseconds per delivered message, wall time and the consumer process's CPU time; the cost is
the median of the per-round differences. The CPU figure is the steadier on a shared host
(other processes' load moves wall time, hardly a process's own CPU time), but it leaves out
PostgreSQL's server work and the wait for the disk at each commit.
"""

from __future__ import annotations

import statistics

from .databases import measure_per_database
from .harness import Bench, Row
from .sizes import Sizes


def atomic_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    program = [
        "bench.djapp.atomic_handler",
        str(sizes.atomic_messages),
        str(sizes.atomic_rounds),
    ]
    measured = measure_per_database(bench, sizes, program, "dq_bench_atomic")
    return [_row(name, got["modes"], got["cpu"], sizes) for name, got in measured.items()]


def _row(
    database: str, wall: dict[str, list[float]], cpu: dict[str, list[float]], sizes: Sizes
) -> Row:
    ratios = [a / p for a, p in zip(wall["atomic"], wall["plain"], strict=True)]
    cost = _differences(wall)
    cpu_cost = _differences(cpu)
    return Row(
        f"atomic.{database}",
        f"a handler inserting one row in a transaction on {database}, "
        f"{sizes.atomic_messages:,} messages x {sizes.atomic_rounds} rounds: atomic queue",
        statistics.median(wall["atomic"]),
        "us/msg",
        baseline=statistics.median(wall["plain"]),
        baseline_what="the same handler, queue not atomic",
        ratio=statistics.median(ratios),
        target="reported",
        note=(
            f"the inbox row adds {statistics.median(cost):.0f} us of wall time per message "
            f"(rounds: {_signed(cost)}) and {statistics.median(cpu_cost):.0f} us of the "
            f"consumer's CPU ({statistics.median(cpu['plain']):.0f} -> "
            f"{statistics.median(cpu['atomic']):.0f}; rounds: {_signed(cpu_cost)})"
        ),
        extra={
            "plain_us": wall["plain"],
            "atomic_us": wall["atomic"],
            "difference_us": cost,
            "cost_us": statistics.median(cost),
            "plain_cpu_us": cpu["plain"],
            "atomic_cpu_us": cpu["atomic"],
            "cpu_difference_us": cpu_cost,
            "cpu_cost_us": statistics.median(cpu_cost),
        },
    )


def _differences(figures: dict[str, list[float]]) -> list[float]:
    """Per round: the atomic queue's figure less the plain one's (the same round's)."""
    return [a - p for a, p in zip(figures["atomic"], figures["plain"], strict=True)]


def _signed(values: list[float]) -> str:
    return ", ".join(f"{v:+.0f}" for v in values)
