"""How big each measurement is: the full run (issue #5's sizes) and the ``--quick`` smoke run."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Sizes:
    rounds: int = 5  # interleaved rounds per ratio (median of the per-round ratios)
    # schedule() rows: many short rounds, so machine noise (seconds long) hits both sides alike
    schedule_rounds: int = 25
    schedule_one: int = 50_000  # one schedule() call per message
    schedule_many: int = 200_000
    schedule_many_batch: int = 1000
    delivery: int = 100_000  # messages due at once, per concurrency
    concurrencies: tuple[int, ...] = (1, 8)
    lateness: int = 5000
    lateness_seconds: float = 20.0
    idle_seconds: float = 10.0
    backlog: int = 5_000_000  # pending messages for the scale and memory rows
    backlog_due: int = 1_000_000  # of which this many fall due together (promotion test)
    backlog_probe: int = 20_000  # schedule() calls timed against the empty and the full queue
    django_path: int = 2000  # view -> schedule -> runqueue -> handler
    outbox_requests: int = 1000  # checkout requests per way and round (bench/outbox_cost.py)
    atomic_messages: int = 2000  # messages per way and round (bench/atomic_cost.py)
    atomic_rounds: int = 3  # bench/atomic_cost.py: its figures are medians of this many rounds
    peer_schedule: int = 20_000
    peer_delivery: int = 20_000
    peer_lateness: int = 1000
    peer_lateness_seconds: float = 10.0
    timeout: float = 300.0  # any one child process
    rate_limit_messages: int = 2000  # bench/rate_limit.py: due at once on a 50/s queue
    rate_limit_window_seconds: int = 5


FULL = Sizes()

QUICK = Sizes(
    rounds=3,
    schedule_rounds=3,
    schedule_one=1500,
    schedule_many=6000,
    delivery=3000,
    lateness=200,
    lateness_seconds=1.0,
    idle_seconds=1.0,
    backlog=30_000,
    backlog_due=10_000,
    backlog_probe=600,
    django_path=100,
    outbox_requests=50,
    atomic_messages=50,
    peer_schedule=600,
    peer_delivery=600,
    peer_lateness=100,
    peer_lateness_seconds=1.0,
    timeout=60.0,
    rate_limit_messages=150,
    rate_limit_window_seconds=1,
)


def sizes_for(quick: bool, backlog: int | None = None) -> Sizes:
    base = QUICK if quick else FULL
    if backlog is not None:
        base = replace(base, backlog=backlog, backlog_due=min(base.backlog_due, backlog // 5))
    return base
