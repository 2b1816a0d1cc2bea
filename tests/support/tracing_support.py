"""OpenTelemetry for the tracing tests: a private SDK tracer provider read back in memory (in the
test's process), and a file exporter that a ``runqueue`` child process writes its spans to.

The test process never sets the global tracer provider: :func:`tracing_on` puts a private one's
tracer where django_delayqueue.core.observability.tracing keeps its own, for one test, so no other
test of the process sees tracing on.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_delayqueue.core.observability import tracing


class Traced:
    """A private tracer provider whose finished spans are read back by name."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]


def tracing_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    """Tracing on for one test (a fixture's body), the package's spans going to a private
    provider."""
    t = Traced()
    monkeypatch.setattr(tracing, "_tracer", t.provider.get_tracer("django_delayqueue"))
    monkeypatch.setattr(tracing, "_parent", "link")
    yield t
    t.provider.shutdown()


class FileSpanExporter(SpanExporter):
    """Appends each finished span to a file as one line of JSON (a child process's spans,
    readable by the test while it runs and after it ends, however it ends)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(s.to_json(indent=None))) + "\n" for s in spans)
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


def read_spans(path: Path, name: str | None = None) -> list[dict[str, Any]]:
    """The spans a child process exported with :class:`FileSpanExporter`."""
    if not path.exists():
        return []
    spans = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [s for s in spans if name is None or s["name"] == name]


def hex_id(value: int, digits: int) -> str:
    """A trace id (32 digits) or span id (16) as the JSON export writes it."""
    return f"0x{value:0{digits}x}"
