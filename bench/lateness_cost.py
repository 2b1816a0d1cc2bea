"""What recording delivery timings (issue 28: start lateness, handler duration, limit wait,
outcomes; django_delayqueue/core/timings) costs the delivery path.

    python -m bench --only lateness_cost [--quick]

- ``lateness_cost.deliver``: no-op messages due at once, delivered by a burst consumer
  (concurrency 1, in process) that records the timings, against the same consumer whose
  recorder does nothing (``_NoTimings``): interleaved rounds, median of the per-round ratios.
  Each recording run also flushes its counts to Redis (one script call per queue per
  maintenance round, and one at the stop).
- ``lateness_cost.deliver_cpu_us``: the CPU time of the process per message in the same runs
  (``time.process_time``, every thread): steadier than the rates on a shared machine, where a
  neighbour's load moves one run's wall time by tens of percent.
- ``lateness_cost.record_ns``: the recorder alone, per delivery: ``DeliveryTimings.record`` on a
  batch of outcomes, nanoseconds per outcome (best of a few runs): the CPU the loop thread
  spends per message.
- ``lateness_cost.otel_ns``: the same with OpenTelemetry metrics on (the SDK's MeterProvider
  with an in-memory reader that is never read: recording only, nothing exported).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from django_delayqueue.core import Message, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.journal import ACK
from django_delayqueue.core.timings.recorder import DeliveryTimings

from .harness import Bench, Row, at_least, at_most
from .sizes import Sizes

QUEUE = "bench-timings"


class _NoTimings(DeliveryTimings):
    """A recorder that records nothing: the baseline (what delivery cost before issue 28)."""

    def record(self, outcomes: Sequence[Outcome]) -> None:
        return None


def lateness_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    return [*_deliver(bench, sizes), *_record_alone(sizes)]


def _deliver(bench: Bench, sizes: Sizes) -> list[Row]:
    count = max(1000, sizes.delivery // 10)
    q = Queue(bench.client, QUEUE, settings=QueueSettings(claim_batch=100, concurrency=1))

    def rate_of(recording: bool) -> tuple[float, float]:
        """One run: the consumer's own rate (scheduling and flushing Redis not timed), and
        the CPU time the process spent per message (us, every thread: loop and handler)."""
        bench.flush()
        q.schedule_many({"payload": i} for i in range(count))
        consumer = Consumer([q], lambda m: None, burst=True)
        if not recording:
            consumer._unrecorded.timings = _NoTimings(consumer._queue_named)
        started, cpu = time.perf_counter(), time.process_time()
        consumer.run()
        cpu_us = (time.process_time() - cpu) / count * 1e6
        assert consumer.delivered == count, consumer.delivered
        return count / (time.perf_counter() - started), cpu_us

    # Interleaved, the order swapped every other round (as harness.interleave does), so that
    # a neighbour's burst of load hits both sides of a round's ratio.
    # Twice the usual rounds, of smaller runs: on a shared machine one run's rate swings by
    # tens of percent, and the CPU time per message (the second row) is the steadier figure.
    rounds: list[tuple[float, float]] = []
    cpu: list[tuple[float, float]] = []
    for r in range(2 * sizes.rounds):
        if r % 2 == 0:
            with_it = rate_of(True)
            without = rate_of(False)
        else:
            without = rate_of(False)
            with_it = rate_of(True)
        rounds.append((with_it[0], without[0]))
        cpu.append((with_it[1], without[1]))
    ratio = statistics.median(a / b for a, b in rounds)
    with_rate = statistics.median(a for a, _ in rounds)
    without_rate = statistics.median(b for _, b in rounds)
    per_message_us = (1 / with_rate - 1 / without_rate) * 1e6
    cpu_with = statistics.median(a for a, _ in cpu)
    cpu_without = statistics.median(b for _, b in cpu)
    cpu_row = Row(
        "lateness_cost.deliver_cpu_us",
        "CPU time of the consumer's process per message (every thread), recording timings",
        cpu_with,
        "us",
        cpu_without,
        "the same consumer with a recorder that does nothing, same run",
        statistics.median(a / b for a, b in cpu),
        "<= 1.05x without",
        at_most(statistics.median(a / b for a, b in cpu), 1.05),
        note=f"{cpu_with - cpu_without:+.2f} us of CPU per message (medians)",
        extra={"rounds": cpu},
    )
    return [
        cpu_row,
        Row(
            "lateness_cost.deliver",
            f"burst consumer, {count:,} no-op messages due at once, recording timings",
            with_rate,
            "msg/s",
            without_rate,
            "the same consumer with a recorder that does nothing, same run",
            ratio,
            ">= 0.95x without",
            at_least(ratio, 0.95),
            note=f"{per_message_us:+.2f} us per message (median rates)",
            extra={"rounds": rounds},
        ),
    ]


def _outcomes(count: int) -> list[Outcome]:
    now = 1_700_000_000_000
    return [
        Outcome(
            Message(f"m{i}", QUEUE, None, now, now, 1, f"t{i}", now), ACK, now + i % 40, now + 50
        )
        for i in range(count)
    ]


def _ns_per_outcome(timings: DeliveryTimings, outcomes: list[Outcome], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter_ns()
        for start in range(0, len(outcomes), 100):  # as the loop takes them: a round's worth
            timings.record(outcomes[start : start + 100])
        best = min(best, (time.perf_counter_ns() - started) / len(outcomes))
    return best


def _record_alone(sizes: Sizes) -> list[Row]:
    outcomes = _outcomes(max(10_000, sizes.delivery))
    q: dict[str, Any] = {}
    plain = _ns_per_outcome(DeliveryTimings(q), outcomes)
    slicing = _ns_per_outcome(_NoTimings(q), outcomes)  # the loop's own slicing, for reference
    rows = [
        Row(
            "lateness_cost.record_ns",
            "DeliveryTimings.record per delivery (the loop thread's CPU), best of 5",
            plain - slicing,
            "ns",
            note=f"{plain:.0f} ns with the benchmark's batching, {slicing:.0f} ns of it batching",
        )
    ]
    otel = _with_otel_sdk()
    if otel is not None:
        timings = DeliveryTimings(q)
        timings.otel = otel
        with_otel = _ns_per_outcome(timings, outcomes)
        rows.append(
            Row(
                "lateness_cost.otel_ns",
                "the same with OpenTelemetry metrics on (SDK, nothing exported)",
                with_otel - slicing,
                "ns",
                plain - slicing,
                "without OpenTelemetry",
                (with_otel - slicing) / max(1e-9, plain - slicing),
            )
        )
    return rows


def _with_otel_sdk() -> Any:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        return None
    from django_delayqueue.core.timings.otel import OtelTimings

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return OtelTimings(provider.get_meter("bench"))
