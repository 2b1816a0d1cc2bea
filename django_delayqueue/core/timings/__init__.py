"""Delivery timings: start lateness, handler duration and limit wait per queue, counted in
fixed buckets by the consumer (:mod:`.recorder`), flushed to Redis minute by minute
(:mod:`.storage`) and read back for the admin, ``queuestats``, health and Prometheus
(:mod:`.reading`); optionally recorded through OpenTelemetry metrics too (:mod:`.otel`)."""
