"""OpenTelemetry spans: ``delayqueue.schedule <queue>`` where a message is scheduled (kind
PRODUCER) and ``delayqueue.deliver <queue>`` around each delivery attempt (kind CONSUMER).

On only where an SDK's tracer provider is set (``trace.set_tracer_provider``) when it is first
asked for (the first schedule or delivery of the process): with the API alone every span would
be a no-op, and without the API there is nothing to call, so then each hook reads one cached
flag and returns. A provider set later is seen after :func:`reset`.

A delivery is LINKED to the producer's span by default, not its child: it may start hours
later, and a trace that ends when the view did reads better than one stretched over the delay
(``parent="child"``, ``DELAYQUEUE["OTEL_PARENT"]``, makes it a child instead). The delivery span
is current while the handler runs, so the handler's own spans are its children.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Literal

from django_delayqueue.core.envelope import Message
from django_delayqueue.core.journal import ACK, GARBAGE, RETRY
from django_delayqueue.core.observability.trace_context import otel_trace, span_context

if TYPE_CHECKING:
    from django_delayqueue.core.clock import Clock
    from django_delayqueue.core.queue import Queue
    from django_delayqueue.core.timings.recorder import DeliveryTimings

logger = logging.getLogger(__name__)

SYSTEM = "delayqueue"
PARENT_MODES = ("link", "child")
Outcome = Literal["ack", "retry", "dead", "stopped"]

# The tracer, once looked for: None not yet, False when tracing is off.
_tracer: Any = None
_parent: str = "link"
_failure_logged = False  # a failing SDK (a span processor that raises) is logged once


def tracer() -> Any:
    """The package's tracer, or False when tracing is off (looked for once, see :func:`reset`)."""
    global _tracer
    if _tracer is None:
        _tracer = _find_tracer()
    return _tracer


def _find_tracer() -> Any:
    otel = otel_trace()
    if otel is False:
        return False
    provider = otel.get_tracer_provider()
    # The API's own providers make only no-op spans: no SDK was set up.
    if isinstance(provider, (otel.ProxyTracerProvider, otel.NoOpTracerProvider)):
        return False
    return provider.get_tracer("django_delayqueue")


def reset() -> None:
    """Look for the tracer provider again at the next schedule or delivery."""
    global _tracer
    _tracer = None


def set_parent_mode(mode: str) -> None:
    """``"link"`` (default): a delivery links to its producer's span; ``"child"``: it is its
    child (same trace)."""
    global _parent
    if mode not in PARENT_MODES:
        raise ValueError(f"OTEL_PARENT must be one of {PARENT_MODES}, not {mode!r}")
    _parent = mode


class _NoSpan:
    """What :func:`producing` gives when tracing is off: a span and its context manager."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()


def producing(queue: str, count: int | None = None) -> Any:
    """The context manager of a producer span for scheduling on ``queue`` (``count``: a batch's
    size); it gives the span, current inside it, so messages prepared there carry its context.
    An exception leaving it is recorded on it (status ERROR)."""
    found = _tracer if _tracer is not None else tracer()
    if found is False:
        return NO_SPAN
    otel = otel_trace()
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "schedule",
    }
    if count is not None:
        attributes["messaging.batch.message_count"] = count
    return _Guarded(
        found.start_as_current_span(
            f"delayqueue.schedule {queue}", kind=otel.SpanKind.PRODUCER, attributes=attributes
        )
    )


class _Guarded:
    """A producer span's context manager whose SDK failures (a span processor raising as the
    span starts or ends) never fail the schedule: it goes on untraced, logged once. What the
    block raises still leaves it, recorded on the span."""

    __slots__ = ("manager",)

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __enter__(self) -> Any:
        try:
            return self.manager.__enter__()
        except Exception:
            self.manager = None
            _tracing_failed("a schedule span not started")
            return NO_SPAN

    def __exit__(self, *exc: Any) -> None:
        if self.manager is None:
            return
        try:
            self.manager.__exit__(*exc)
        except Exception as e:
            if e is exc[1]:
                raise  # the block's own exception, passed on by the span (recorded there)
            _tracing_failed("a schedule span not ended")


def scheduled(span: Any, message_id: str, due_ms: int) -> None:
    """Name the message a producer span scheduled (nothing on a span that records nothing)."""
    if span.is_recording():
        span.set_attribute("messaging.message.id", message_id)
        span.set_attribute("delayqueue.due_ms", due_ms)


class Delivery:
    """A delivery span started and made current (:func:`delivery_started`)."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any, token: Any) -> None:
        self.span, self.token = span, token


def delivery_started(
    message: Message, q: Queue | None, clock: Clock, timings: DeliveryTimings | None = None
) -> Delivery | None:
    """Start the span of one delivery attempt of ``message`` (from ``q``, its queue or shard;
    its handler starts now), current on this thread or task until :func:`delivery_ended`;
    None when tracing is off, or when the SDK failed to start it: tracing never fails a
    delivery (its handler runs untraced, the failure logged once). ``timings``: the
    consumer's, whose due instant and limit wait the span's lateness takes, as the lateness
    histogram does (a retry's retry time, a requeued message's requeue)."""
    found = _tracer if _tracer is not None else tracer()
    if found is False:
        return None
    try:
        return _start_delivery(found, message, q, clock, timings)
    except Exception:  # an SDK's span processor (on_start) or sampler raised
        _tracing_failed("a delivery span not started")
        return None


def _tracing_failed(what: str) -> None:
    """Log a failure of the tracing SDK once per process (it would fail every delivery)."""
    global _failure_logged
    if _failure_logged:
        return
    _failure_logged = True
    logger.warning(
        "OpenTelemetry failed: %s, messages are delivered untraced (logged once)",
        what,
        exc_info=True,
    )


def _start_delivery(
    found: Any, message: Message, q: Queue | None, clock: Clock, timings: DeliveryTimings | None
) -> Delivery:
    queue = message.queue if q is None else q.logical_name
    now_ms = clock.now_ms()
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "deliver",
        "messaging.message.id": message.id,
        # The attempt, counted from 1, as the messaging conventions' systems name it.
        "messaging.delayqueue.message.delivery_count": message.attempt,
    }
    due: int | None = message.due_ms
    waited = 0
    if timings is not None:
        due, waited = timings.due_of(message), timings.limit_wait(message)
    if due is not None:  # unknown (a retry the consumer cannot date): no lateness, as counted
        attributes["delayqueue.due_ms"] = due
        attributes["delayqueue.lateness_ms"] = max(0, now_ms - due - waited)
    from opentelemetry import context as otel_context

    otel = otel_trace()
    producer = span_context(message.trace)
    links: tuple[Any, ...] = ()
    parent = otel_context.Context()  # a new trace, whatever the thread or task ran before
    if producer is not None:
        if _parent == "child":
            parent = otel.set_span_in_context(otel.NonRecordingSpan(producer), parent)
        else:
            links = (otel.Link(producer),)
    span = found.start_span(
        f"delayqueue.deliver {queue}",
        context=parent,
        kind=otel.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
    )
    token = otel_context.attach(otel.set_span_in_context(span))
    return Delivery(span, token)


def delivery_ended(delivery: Delivery, outcome: Outcome, reason: str = "") -> None:
    """End a delivery span with its outcome (status ERROR unless acknowledged); on the thread
    or task that started it. Never raises: an SDK that fails here (a span processor's
    on_end) loses the span, not the delivery's outcome (logged once)."""
    from opentelemetry import context as otel_context

    otel = otel_trace()
    try:
        try:
            otel_context.detach(delivery.token)
        finally:
            span = delivery.span
            span.set_attribute("delayqueue.outcome", outcome)
            if outcome != "ack":
                span.set_status(otel.Status(otel.StatusCode.ERROR, reason or outcome))
            span.end()
    except Exception:
        _tracing_failed("a delivery span not ended")


class EndedLater:
    """A delivery span whose handler ended (its context detached, its end time taken) and
    whose outcome is told once the consumer's nack replied (:meth:`end`): nack.lua may find
    the message aborted meanwhile, and then the span says ``stopped``, as a direct abort's.
    ``outcome`` and ``reason`` are what the delivery came to so far."""

    __slots__ = ("end_ns", "outcome", "reason", "span")

    def __init__(self, span: Any, outcome: Outcome, reason: str, end_ns: int) -> None:
        self.span, self.outcome, self.reason, self.end_ns = span, outcome, reason, end_ns

    def end(self) -> None:
        """End the span with its outcome, at the instant its handler ended; never raises."""
        otel = otel_trace()
        try:
            span = self.span
            span.set_attribute("delayqueue.outcome", self.outcome)
            span.set_status(otel.Status(otel.StatusCode.ERROR, self.reason or self.outcome))
            span.end(end_time=self.end_ns)
        except Exception:
            _tracing_failed("a delivery span not ended")


def delivery_left(delivery: Delivery, outcome: Outcome, reason: str = "") -> EndedLater | None:
    """Detach a failed delivery's span (on the thread or task that started it) and take its
    end time, its end left to the consumer once its nack replied (:class:`EndedLater`); None
    when the SDK failed here (the span is lost, logged once)."""
    from opentelemetry import context as otel_context

    try:
        otel_context.detach(delivery.token)
    except Exception:
        _tracing_failed("a delivery span not ended")
        return None
    return EndedLater(delivery.span, outcome, reason, time.time_ns())


def outcome_name(status: str, attempt: int, max_attempts: int, stopped: bool) -> Outcome:
    """What a delivery came to, as its span says: ``stopped`` (a time limit or an abort),
    ``dead`` (rejected, or a failure on its last attempt), ``retry`` or ``ack``."""
    if stopped:
        return "stopped"
    if status == ACK:
        return "ack"
    if status == GARBAGE or (status == RETRY and attempt >= max_attempts):
        return "dead"
    return "retry"


def record_failure(error: BaseException) -> None:
    """Record ``error``, which a handler raised, on the delivery span (the current one)."""
    if _tracer is None or _tracer is False:
        return
    try:
        span = otel_trace().get_current_span()
        if span.is_recording():
            span.record_exception(error)
    except Exception:
        _tracing_failed("a handler's exception not recorded on its span")
