"""Every series name the app's ``metrics/`` endpoint can export: what the shipped alert rules
and Grafana dashboard may name (tests/docs/test_alert_rules.py, tests/app/test_prometheus.py)."""

from __future__ import annotations

import re

# A metric name of the app's in PromQL text (label names and values never start with it).
METRIC_NAME = re.compile(r"\bdelayqueue_[a-z_]+")


def exported_names() -> set[str]:
    """Every series name metrics/ can export (a histogram's ``_bucket``, ``_sum``, ``_count``
    and a counter's ``_total`` included)."""
    from django_delayqueue.monitoring import metrics, timing_metrics

    names = {f"delayqueue_redis_{n}" for n in metrics.SERVER_FAMILIES}
    names |= {f"delayqueue_schedule_{n}" for n in metrics.SCHEDULE_FAMILIES}
    for name, (kind, _, _) in metrics.FAMILIES.items():
        names.add(f"delayqueue_{name}_total" if kind == "counter" else f"delayqueue_{name}")
    for metric, _ in timing_metrics.HISTOGRAM_FAMILIES.values():
        names |= {metric, f"{metric}_bucket", f"{metric}_sum", f"{metric}_count"}
    names.add(f"{timing_metrics.OUTCOMES_FAMILY}_total")
    return names
