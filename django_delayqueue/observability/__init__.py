"""Observability without Django: OpenTelemetry traces (``context``: the trace context a message
carries; ``tracing``: the producer and delivery spans) and the fields every log line about one
message carries (``log_fields``).

OpenTelemetry is optional (the ``otel`` extra): nothing here imports it until a message is
scheduled or delivered, and without it (or without an SDK's tracer provider) every hook is a
flag read.
"""
