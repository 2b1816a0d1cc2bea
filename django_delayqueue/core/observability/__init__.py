"""Observability without Django: OpenTelemetry traces (``trace_context``: the trace context a
message carries; ``tracing``: the producer and delivery spans) and the fields every log line
about one message carries (``log_fields``).

Here, in the core, because the core schedules and delivers messages (and logs about them) and
imports nothing above itself; ``django_delayqueue.observability`` re-exports these modules for
the Django layer's older callers.

OpenTelemetry is optional (the ``otel`` extra): nothing here imports it until a message is
scheduled or delivered, and without it (or without an SDK's tracer provider) every hook is a
flag read.
"""
