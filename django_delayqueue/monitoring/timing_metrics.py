"""The delivery timings as Prometheus histograms and counters (part of monitoring.metrics).

Read from each queue's totals hash in Redis (core.timings), which every consumer of the queue
adds its counts to every few seconds: only ever incremented, never expiring, so the series are
monotonic whichever web process serves the scrape and however many consumers come and go (a
reset happens only if someone deletes the key, which ``rate()`` copes with). Buckets are
cumulative, as the exposition format wants, with the bounds of core.timings.buckets in seconds:

- ``delayqueue_start_lateness_seconds``: handler start minus due time (a retry's: its retry
  time), less the time a flow limit held the message back;
- ``delayqueue_handler_duration_seconds``;
- ``delayqueue_limit_wait_seconds``: queues with a flow limit (queue or key) only;
- ``delayqueue_delivery_outcomes_total{outcome}``: ack, retry, dead, stopped, as the consumers
  saw them (``delayqueue_outcomes_total`` is the journal's count: ack, retry, dead).
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.timings.buckets import BOUNDS_SECONDS
from django_delayqueue.core.timings.counts import OUTCOMES, TimingCounts

# histogram name in TimingCounts -> (metric name, help text)
HISTOGRAM_FAMILIES: dict[str, tuple[str, str]] = {
    "lateness": (
        "delayqueue_start_lateness_seconds",
        "Handler start minus due time (a retry's: its retry time), less any flow-limit wait.",
    ),
    "duration": ("delayqueue_handler_duration_seconds", "How long handlers ran."),
    "limit_wait": (
        "delayqueue_limit_wait_seconds",
        "How long a flow limit (rate_limit, max_in_flight, key limits) held a due message back.",
    ),
}
OUTCOMES_FAMILY = "delayqueue_delivery_outcomes"
_LE = [f"{bound:g}" for bound in BOUNDS_SECONDS] + ["+Inf"]


def timing_families() -> dict[str, Any]:
    """Empty families, filled per queue by :func:`add_timings`."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    families: dict[str, Any] = {
        name: HistogramMetricFamily(metric, text, labels=["queue"])
        for name, (metric, text) in HISTOGRAM_FAMILIES.items()
    }
    families["outcomes"] = CounterMetricFamily(
        OUTCOMES_FAMILY,
        "Deliveries by outcome as the consumers recorded them (ack, retry, dead, stopped).",
        labels=["queue", "outcome"],
    )
    return families


def add_timings(queue: str, counts: TimingCounts, families: dict[str, Any]) -> None:
    """Queue ``queue``'s totals into ``families``. A histogram with nothing in it (limit wait
    of a queue without limits) is left out."""
    for name in HISTOGRAM_FAMILIES:
        buckets, running = [], 0
        for le, value in zip(_LE, counts.histograms[name], strict=True):
            running += value
            buckets.append((le, running))
        if running or name != "limit_wait":
            families[name].add_metric([queue], buckets, sum_value=counts.sums[name] / 1000)
    for outcome in OUTCOMES:
        families["outcomes"].add_metric([queue, outcome], counts.outcomes.get(outcome, 0))
