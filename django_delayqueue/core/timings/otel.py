"""Delivery timings through OpenTelemetry metrics, when the site configured a MeterProvider.

Off, and free, otherwise: without the ``opentelemetry`` API installed, or with only its default
(proxy or no-op) provider, :meth:`OtelTimings.if_configured` returns None and the recorder
makes no call at all per message. The consumer asks again at each maintenance, so a provider
set after the consumer started is picked up within seconds. Recorded in the consumer's process
(the SDK's readers and exporters run there), with the same bucket bounds as the Prometheus
histograms, given as advice to the SDK.

Instruments (unit: seconds), with attributes ``messaging.system`` ("delayqueue") and
``messaging.destination.name`` (the queue):
``delayqueue.start_lateness``, ``delayqueue.handler.duration``, ``delayqueue.limit_wait``
(queues with a flow limit only), and the counter ``delayqueue.outcomes`` with ``outcome``.
"""

from __future__ import annotations

import logging
from typing import Any

from django_delayqueue.core.timings.buckets import BOUNDS_SECONDS

logger = logging.getLogger(__name__)

METER_NAME = "django_delayqueue"
# The API's own providers before the site sets one: recording through them costs for nothing.
_DEFAULT_PROVIDERS = frozenset({"_ProxyMeterProvider", "NoOpMeterProvider"})
_api_missing = False  # the opentelemetry API is not installed (found out once)


class OtelTimings:
    """The instruments of one MeterProvider, and the attributes of each queue (made once)."""

    def __init__(self, meter: Any) -> None:
        self.lateness = _histogram(
            meter, "delayqueue.start_lateness", "Handler start minus due time, less any limit wait."
        )
        self.duration = _histogram(meter, "delayqueue.handler.duration", "How long handlers ran.")
        self.limit_wait = _histogram(
            meter, "delayqueue.limit_wait", "How long a flow limit held a due message back."
        )
        self.outcomes = meter.create_counter(
            "delayqueue.outcomes", unit="{delivery}", description="Deliveries by outcome."
        )
        self._attributes: dict[tuple[str, str], dict[str, str]] = {}

    @classmethod
    def if_configured(cls) -> OtelTimings | None:
        """The instruments, when the API is importable and a MeterProvider was set; else None."""
        global _api_missing
        if _api_missing:
            return None
        try:
            from opentelemetry import metrics
        except ImportError:  # asked again every maintenance: remember, not search sys.path
            _api_missing = True
            return None
        provider = metrics.get_meter_provider()
        if type(provider).__name__ in _DEFAULT_PROVIDERS:
            return None
        try:
            return cls(provider.get_meter(METER_NAME))
        except Exception:  # a provider that cannot make these: no metrics, never a crash
            logger.exception("OpenTelemetry metrics for the delay queue are off")
            return None

    def record(
        self,
        queue: str,
        late_ms: int | None,
        took_ms: int,
        waited_ms: int | None,
        outcome: str | None,
    ) -> None:
        """One delivery's timings (ms; None: not known, or no flow limit) and outcome (None:
        counted later, with :meth:`count`)."""
        base = self._attributes.get((queue, ""))
        if base is None:
            base = self._attributes[(queue, "")] = {
                "messaging.system": "delayqueue",
                "messaging.destination.name": queue,
            }
        if late_ms is not None:
            self.lateness.record(late_ms / 1000, base)
        self.duration.record(took_ms / 1000, base)
        if waited_ms is not None:
            self.limit_wait.record(waited_ms / 1000, base)
        if outcome is not None:
            self.count(queue, outcome)

    def count(self, queue: str, outcome: str) -> None:
        """One delivery of ``queue`` that came to ``outcome``."""
        with_outcome = self._attributes.get((queue, outcome))
        if with_outcome is None:
            base = {"messaging.system": "delayqueue", "messaging.destination.name": queue}
            with_outcome = self._attributes[(queue, outcome)] = {**base, "outcome": outcome}
        self.outcomes.add(1, with_outcome)


def _histogram(meter: Any, name: str, description: str) -> Any:
    try:
        return meter.create_histogram(
            name,
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=list(BOUNDS_SECONDS),
        )
    except TypeError:  # an API before the advice (1.30): the SDK's default buckets
        return meter.create_histogram(name, unit="s", description=description)
