"""The tracing tests' app in a ``runqueue`` child process: its receivers, and, with
``$TRACING_SPANS``, an OpenTelemetry SDK set up as a project would (in ``AppConfig.ready``),
each finished span written to that file."""

from __future__ import annotations

import os

from django.apps import AppConfig


class TracingConfig(AppConfig):
    name = "tracing_app"
    label = "tracing_app"
    verbose_name = "Tracing test handlers"

    def ready(self) -> None:
        from . import handlers  # noqa: F401  (connects the receivers)

        spans = os.environ.get("TRACING_SPANS")
        if spans:  # never imported without it: the "OpenTelemetry absent" test hides it
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from tracing_support import FileSpanExporter

            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(spans)))
            trace.set_tracer_provider(provider)
