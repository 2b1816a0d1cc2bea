"""The trace context a message carries in its envelope, and reading it back.

W3C Trace Context (``traceparent``, ``tracestate``) in a compact form: the 32 hex digits of the
trace id, the 16 of the span id and the 2 of the flags (the ``traceparent`` header without its
version and dashes: 50 characters, not 55), then, when the span has one, a space and the
``tracestate`` header as it is. Taken from the span current when the message is scheduled (the
producer span, see ``tracing``); "" when there is none or OpenTelemetry is not installed.

The OpenTelemetry API is imported on the first call, not with this module: the Django-free core
imports this, and a Spark executor or a script without the ``otel`` extra must not pay for it.
"""

from __future__ import annotations

import re
from typing import Any

# Kept to the W3C limits: a ``tracestate`` header is at most 512 characters of printable ASCII
# (a newline would end the envelope's field early, see core/envelope.py).
MAX_TRACESTATE = 512
_FIELD = re.compile(r"([0-9a-f]{32})([0-9a-f]{16})([0-9a-f]{2})(?: ([ -~]{1,512}))?\Z")

# The opentelemetry.trace module once looked for; False when it is not installed.
_otel: Any = None


def otel_trace() -> Any:
    """``opentelemetry.trace``, or False when the API is not installed (looked for once)."""
    global _otel
    if _otel is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _otel = False
        else:
            _otel = trace
    return _otel


def current_trace() -> str:
    """The current span's context as the envelope's trace field; "" without a valid span."""
    otel = _otel if _otel is not None else otel_trace()
    if otel is False:
        return ""
    context = otel.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return trace_field(context.trace_id, context.span_id, context.trace_flags, state_of(context))


def trace_field(trace_id: int, span_id: int, flags: int, tracestate: str = "") -> str:
    """The compact field of a span context (``tracestate`` dropped if it cannot be kept)."""
    field = f"{trace_id:032x}{span_id:016x}{int(flags) & 0xFF:02x}"
    if tracestate and len(tracestate) <= MAX_TRACESTATE and tracestate.isprintable():
        field += f" {tracestate}"
    return field


def state_of(context: Any) -> str:
    state = context.trace_state
    return state.to_header() if state else ""


def parse_trace(field: str) -> tuple[int, int, int, str] | None:
    """(trace id, span id, flags, tracestate) of a field; None for one that is not valid (an
    envelope from another producer, say: its message is delivered without the link)."""
    match = _FIELD.match(field)
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(match[3], 16), match[4] or ""


def span_context(field: str) -> Any:
    """The remote ``SpanContext`` of a message's trace field; None without one (or otel)."""
    parsed = parse_trace(field) if field else None
    otel = otel_trace()
    if parsed is None or otel is False:
        return None
    trace_id, span_id, flags, state = parsed
    return otel.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=otel.TraceFlags(flags),
        trace_state=otel.TraceState.from_header([state]) if state else None,
    )


def traceparent(field: str) -> str | None:
    """The W3C ``traceparent`` header of a trace field (for logs and tests); None if invalid."""
    parsed = parse_trace(field)
    if parsed is None:
        return None
    trace_id, span_id, flags, _state = parsed
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
