"""Re-exports :mod:`django_delayqueue.core.observability.trace_context`, where the trace context a
message carries now lives (the Django-free core imports it, and imports nothing above itself).

Kept for the Django layer's existing callers; new code imports the core's module. Nothing is
defined here: the module's state (whether OpenTelemetry was found) is the core module's.
"""

from django_delayqueue.core.observability.trace_context import (
    MAX_TRACESTATE,
    current_trace,
    otel_trace,
    parse_trace,
    span_context,
    state_of,
    trace_field,
    traceparent,
)

__all__ = [
    "MAX_TRACESTATE",
    "current_trace",
    "otel_trace",
    "parse_trace",
    "span_context",
    "state_of",
    "trace_field",
    "traceparent",
]
