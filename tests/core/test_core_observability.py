"""django_delayqueue.core.observability: the trace context in the envelope, producer and delivery
spans (OpenTelemetry SDK, in memory), and the core without OpenTelemetry (nor Django)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from core_consumer_support import T0, Started, burst
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind, StatusCode
from paths import ROOT
from tracing_support import Traced, tracing_on
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import CorruptEnvelope, Message, Queue, SystemClock
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.envelope import (
    EnvelopeParts,
    decode_envelope,
    decode_envelope_parts,
    decode_marked_envelope,
    encode_envelope,
)
from django_delayqueue.core.errors import Reject, Retry
from django_delayqueue.core.observability import tracing
from django_delayqueue.core.observability.trace_context import (
    current_trace,
    parse_trace,
    trace_field,
    traceparent,
)


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    yield from tracing_on(monkeypatch)


TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


# --- the envelope's field ------------------------------------------------------------------------


def test_trace_field_is_the_traceparent_without_version_and_dashes() -> None:
    field = trace_field(TRACE_ID, SPAN_ID, 1)
    assert field == "0af7651916cd43dd8448eb211c80319cb7ad6b716920333101"
    assert traceparent(field) == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert parse_trace(field) == (TRACE_ID, SPAN_ID, 1, "")


def test_tracestate_is_kept_after_a_space_and_dropped_when_it_cannot_be() -> None:
    field = trace_field(TRACE_ID, SPAN_ID, 1, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert parse_trace(field) == (TRACE_ID, SPAN_ID, 1, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    # A newline would end the envelope's field early; past 512 characters it is not W3C's.
    assert parse_trace(trace_field(TRACE_ID, SPAN_ID, 1, "a=b\nc=d"))[3] == ""  # type: ignore[index]
    assert parse_trace(trace_field(TRACE_ID, SPAN_ID, 1, "a=" + "b" * 600))[3] == ""  # type: ignore[index]


@pytest.mark.parametrize(
    "field", ["", "zz", "0" * 50, "0af7651916cd43dd8448eb211c80319c" + "0" * 18, "A" * 50]
)
def test_an_invalid_field_is_no_context(field: str) -> None:
    assert parse_trace(field) is None and traceparent(field) is None


def test_envelope_carries_the_trace_before_the_task_mark_and_the_payload() -> None:
    field = trace_field(TRACE_ID, SPAN_ID, 1, "k=v")
    envelope = encode_envelope('{"a":1}', 2_000, 1_000, task=True, trace=field)
    assert envelope == f'7d0,3e8,^{field}\nt,{{"a":1}}'
    parts = EnvelopeParts(2_000, 1_000, {"a": 1}, True, None, field)
    assert decode_envelope_parts(envelope) == parts
    assert decode_envelope_parts(envelope.encode()) == parts
    assert decode_marked_envelope(envelope) == (2_000, 1_000, {"a": 1}, True)
    assert decode_envelope(envelope) == (2_000, 1_000, {"a": 1})
    # Without a trace the envelope is as it was, byte for byte.
    assert encode_envelope('{"a":1}', 2_000, 1_000) == '7d0,3e8,{"a":1}'
    assert decode_envelope_parts('7d0,3e8,{"a":1}') == EnvelopeParts(2_000, 1_000, {"a": 1})
    # After a flow key (which Lua reads right after the times), before the task mark.
    keyed = encode_envelope('{"a":1}', 2_000, 1_000, task=True, key="shop,7", trace=field)
    assert keyed == f'7d0,3e8,k6,shop,7^{field}\nt,{{"a":1}}'
    assert decode_envelope_parts(keyed) == EnvelopeParts(
        2_000, 1_000, {"a": 1}, True, "shop,7", field
    )


def test_a_trace_field_without_its_end_is_a_corrupt_envelope() -> None:
    with pytest.raises(CorruptEnvelope, match="trace context has no end"):
        decode_envelope("7d0,3e8,^0af7651916cd43dd")


def test_no_span_no_field(make_queue: Any, redis_client: redis.Redis) -> None:
    assert current_trace() == ""
    q: Queue = make_queue()
    q.schedule({"a": 1}, id="m")
    assert redis_client.hget(q.keys.messages, "m") == f'{T0:x},0,{{"a":1}}'.encode()


# --- producer spans -------------------------------------------------------------------------------


def test_schedule_in_a_span_stores_its_producer_spans_context(
    make_queue: Any, redis_client: redis.Redis, traced: Traced
) -> None:
    q: Queue = make_queue("orders")
    with traced.tracer.start_as_current_span("view") as view:
        q.schedule({"order": 42}, id="m1", delay=30)
    producer = traced.one("delayqueue.schedule orders")
    assert producer.kind == SpanKind.PRODUCER
    assert (
        producer.parent is not None and producer.parent.span_id == view.get_span_context().span_id
    )
    assert producer.attributes is not None
    assert dict(producer.attributes) == {
        "messaging.system": "delayqueue",
        "messaging.destination.name": "orders",
        "messaging.operation.type": "send",
        "messaging.operation.name": "schedule",
        "messaging.message.id": "m1",
        "delayqueue.due_ms": T0 + 30_000,
    }
    trace = decode_envelope_parts(redis_client.hget(q.keys.messages, "m1")).trace
    context = producer.get_span_context()
    assert parse_trace(trace) == (context.trace_id, context.span_id, context.trace_flags, "")


def test_schedule_many_is_one_producer_span_every_message_carries(
    make_queue: Any, redis_client: redis.Redis, traced: Traced
) -> None:
    q: Queue = make_queue("bulk")
    result = q.schedule_many([{"payload": i, "id": f"b{i}"} for i in range(3)] + ["not a mapping"])
    assert result.scheduled == 3 and len(result.rejected) == 1
    span = traced.one("delayqueue.schedule bulk")
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == 3
    sid = span.get_span_context().span_id
    for i in range(3):
        trace = decode_envelope_parts(redis_client.hget(q.keys.messages, f"b{i}")).trace
        assert parse_trace(trace)[1] == sid  # type: ignore[index]


def test_a_refused_schedule_records_its_exception(make_queue: Any, traced: Traced) -> None:
    q: Queue = make_queue("orders")
    with pytest.raises(Exception, match="not JSON-serialisable"):
        q.schedule(object())
    span = traced.one("delayqueue.schedule orders")
    assert span.status.status_code == StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


# --- delivery spans -------------------------------------------------------------------------------


def _scheduled_in_a_span(q: Queue, traced: Traced, message_id: str, payload: Any) -> Any:
    with traced.tracer.start_as_current_span("view"):
        q.schedule(payload, id=message_id)
    return traced.one(f"delayqueue.schedule {q.name}").get_span_context()


def test_delivery_span_links_to_the_producer_and_is_current_in_the_handler(
    make_queue: Any, traced: Traced
) -> None:
    q: Queue = make_queue("orders")
    producer = _scheduled_in_a_span(q, traced, "m1", {"order": 1})

    def handler(message: Message) -> None:
        with traced.tracer.start_as_current_span("handler work"):
            pass

    burst([q], handler)
    deliver = traced.one("delayqueue.deliver orders")
    assert deliver.kind == SpanKind.CONSUMER
    assert deliver.parent is None  # a trace of its own: linked, not a child
    assert [link.context.span_id for link in deliver.links] == [producer.span_id]
    assert deliver.links[0].context.trace_id == producer.trace_id
    attributes = dict(deliver.attributes or {})
    assert attributes == {
        "messaging.system": "delayqueue",
        "messaging.destination.name": "orders",
        "messaging.operation.type": "process",
        "messaging.operation.name": "deliver",
        "messaging.message.id": "m1",
        "messaging.delayqueue.message.delivery_count": 1,
        "delayqueue.due_ms": T0,
        "delayqueue.lateness_ms": 0,  # the manual clock stands still
        "delayqueue.outcome": "ack",
    }
    assert deliver.status.status_code == StatusCode.UNSET
    work = traced.one("handler work")
    assert work.parent is not None and work.parent.span_id == deliver.get_span_context().span_id


def test_child_mode_puts_the_delivery_in_the_producers_trace(
    make_queue: Any, traced: Traced, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracing.set_parent_mode("child")
    q: Queue = make_queue("orders")
    producer = _scheduled_in_a_span(q, traced, "m1", 1)
    burst([q], lambda m: None)
    deliver = traced.one("delayqueue.deliver orders")
    assert deliver.parent is not None and deliver.parent.span_id == producer.span_id
    assert deliver.get_span_context().trace_id == producer.trace_id
    assert not deliver.links
    with pytest.raises(ValueError, match="OTEL_PARENT"):
        tracing.set_parent_mode("sibling")


def test_a_failing_attempt_records_its_exception_and_an_error_status(
    make_queue: Any, traced: Traced
) -> None:
    q: Queue = make_queue("orders", max_attempts=2, backoff_base=60)
    _scheduled_in_a_span(q, traced, "m1", 1)

    def handler(message: Message) -> None:
        raise ValueError("order 1 has no address")

    burst([q], handler)
    deliver = traced.one("delayqueue.deliver orders")
    assert deliver.status.status_code == StatusCode.ERROR
    assert deliver.status.description == "ValueError: order 1 has no address"
    assert deliver.attributes is not None and deliver.attributes["delayqueue.outcome"] == "retry"
    (event,) = deliver.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "order 1 has no address"


@pytest.mark.parametrize(
    ("max_attempts", "raised", "outcome"),
    [(1, ValueError("x"), "dead"), (5, Reject("bad order"), "dead")],
)
def test_a_last_attempt_or_a_reject_is_dead(
    make_queue: Any, traced: Traced, max_attempts: int, raised: Exception, outcome: str
) -> None:
    q: Queue = make_queue("orders", max_attempts=max_attempts)
    q.schedule(1, id="m1")

    def handler(message: Message) -> None:
        raise raised

    burst([q], handler)
    deliver = traced.one("delayqueue.deliver orders")
    assert deliver.attributes is not None and deliver.attributes["delayqueue.outcome"] == outcome
    # Scheduled outside any span: linked to its own producer span, the root of its trace.
    producer = traced.one("delayqueue.schedule orders")
    assert producer.parent is None
    assert [link.context.span_id for link in deliver.links] == [producer.context.span_id]


def test_an_async_handler_runs_inside_its_delivery_span(make_queue: Any, traced: Traced) -> None:
    q: Queue = make_queue("orders")
    producer = _scheduled_in_a_span(q, traced, "m1", 1)

    async def handler(message: Message) -> None:
        with traced.tracer.start_as_current_span("async work"):
            raise KeyError("gone")

    burst([q], handler)
    deliver = traced.one("delayqueue.deliver orders")
    assert [link.context.span_id for link in deliver.links] == [producer.span_id]
    assert deliver.attributes is not None and deliver.attributes["delayqueue.outcome"] == "retry"
    assert [e.name for e in deliver.events] == ["exception"]
    work = traced.one("async work")
    assert work.parent is not None and work.parent.span_id == deliver.get_span_context().span_id


def test_tracing_is_off_with_the_api_alone() -> None:
    # The test process never sets a global provider: the API's proxy makes no-op spans only.
    tracing.reset()
    try:
        assert tracing.tracer() is False
        assert tracing.producing("q") is tracing.NO_SPAN
    finally:
        tracing.reset()


# --- without OpenTelemetry ------------------------------------------------------------------------

WITHOUT_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # not installed, as far as this process can tell
sys.modules["django"] = None  # nor Django: the core stands alone
import redis
from django_delayqueue.core import Queue
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.envelope import encode_envelope
from django_delayqueue.core.observability import trace_context, tracing
from django_delayqueue.core.results import Prepared

q = Queue(redis.Redis.from_url(sys.argv[1]), "plain")
q.schedule({"n": 1}, id="a")
# What a traced producer stores: delivered all the same, its context unread.
now = q.clock.now_ms()
q.send_prepared(Prepared("b", now, encode_envelope('{"n":2}', now, now, trace=sys.argv[2])))
seen = []
Consumer([q], lambda m: seen.append((m.id, m.payload, m.trace)), burst=True).run()
print(sorted(seen), trace_context.current_trace() == "", tracing.tracer(), q.counts()["ready"])
"""


def test_the_core_schedules_and_delivers_without_opentelemetry_or_django(
    redis_client: redis.Redis, redis_server: Any
) -> None:
    field = trace_field(TRACE_ID, SPAN_ID, 1)
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, redis_server.url, field],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    delivered = f"[('a', {{'n': 1}}, ''), ('b', {{'n': 2}}, '{field}')]"
    assert done.stdout.split("\n")[0] == f"{delivered} True False 0"


def test_an_aborted_delivery_is_stopped(make_queue: Any, traced: Traced) -> None:
    q: Queue = make_queue("long", clock=SystemClock(), abort_grace_seconds=600)
    q.schedule("job", id="j")
    started = threading.Event()

    def long_job(m: Message) -> None:
        started.set()
        while not m.aborted:
            threading.Event().wait(0.01)

    running = Started()
    try:
        running(Consumer([q], long_job, idle_seconds=0.1))
        assert started.wait(TIMEOUT)
        assert q.abort("j", "by staff").running
        wait_until(lambda: traced.spans("delayqueue.deliver long"))
    finally:
        running.stop_all()
    deliver = traced.one("delayqueue.deliver long")
    assert deliver.attributes is not None and deliver.attributes["delayqueue.outcome"] == "stopped"
    assert deliver.status.status_code == StatusCode.ERROR
    assert deliver.status.description == "aborted: by staff"


class _RaisingProcessor(SpanProcessor):
    """An SDK span processor that fails as the span starts, or as it ends."""

    def __init__(self, when: str) -> None:
        self.when = when

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.when == "start":
            raise RuntimeError("processor broke on start")

    def on_end(self, span: Any) -> None:
        if self.when == "end":
            raise RuntimeError("processor broke on end")


@pytest.mark.parametrize("when", ["start", "end"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_failing_span_processor_never_fails_a_delivery(
    make_queue: Any,
    traced: Traced,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    when: str,
    asynchronous: bool,
) -> None:
    """Tracing is the operator's aid, never the handler's condition: an SDK whose processor
    raises delivers every message (its handler runs, it is acknowledged), logged once."""
    monkeypatch.setattr(tracing, "_failure_logged", False)
    q: Queue = make_queue("orders")
    q.schedule(1, id="m1")
    q.schedule(2, id="m2")
    traced.provider.add_span_processor(_RaisingProcessor(when))  # once they are scheduled
    ran: list[str] = []

    def handler(message: Message) -> None:
        ran.append(message.id)

    async def ahandler(message: Message) -> None:
        ran.append(message.id)

    burst([q], ahandler if asynchronous else handler)
    assert sorted(ran) == ["m1", "m2"]
    assert q.counts()["unack"] == 0 and q.counts()["retry"] == 0 and q.counts()["garbage"] == 0
    failures = [r for r in caplog.records if r.name == tracing.__name__]
    assert len(failures) == 1 and failures[0].levelname == "WARNING"
    assert "untraced" in failures[0].getMessage()


def _deliveries(traced: Traced, queue: str) -> dict[int, dict[str, Any]]:
    """The attributes of each delivery span of ``queue``, by attempt."""
    spans = [dict(s.attributes or {}) for s in traced.spans(f"delayqueue.deliver {queue}")]
    return {a["messaging.delayqueue.message.delivery_count"]: a for a in spans}


def test_a_retrys_span_is_dated_from_its_retry_time_as_the_lateness_histogram(
    make_queue: Any, traced: Traced, manual_clock: Any
) -> None:
    """A retry due 10 s after its first due time and started 7 ms after that is 7 ms late, on
    its span as in the histograms: not 10 s from its envelope's first due time."""
    q: Queue = make_queue("orders", max_attempts=2)
    q.schedule(1, id="m1")

    def handler(message: Message) -> None:
        if message.attempt == 1:
            raise Retry(delay=10)

    burst([q], handler)
    manual_clock.advance(ms=10_007)
    burst([q], handler)  # another consumer: the retry time comes from the claim
    retried = _deliveries(traced, "orders")[2]
    assert retried["delayqueue.due_ms"] == T0 + 10_000
    assert retried["delayqueue.lateness_ms"] == 7


def test_a_requeued_dead_letters_span_is_dated_from_its_requeue(
    make_queue: Any, traced: Traced, manual_clock: Any
) -> None:
    """A dead letter requeued a day later starts with fresh attempts (attempt 1 again): its
    span's due time is its requeue, as its lateness histogram counts it, not a day ago."""
    q: Queue = make_queue("orders", max_attempts=1)
    q.schedule(1, id="m1")
    burst([q], lambda m: (_ for _ in ()).throw(Reject("bug")))
    manual_clock.advance(ms=86_400_000)
    assert q.requeue("m1") == 1
    manual_clock.advance(ms=3)
    burst([q], lambda m: None)
    spans = [dict(s.attributes or {}) for s in traced.spans("delayqueue.deliver orders")]
    assert [s["delayqueue.outcome"] for s in spans] == ["dead", "ack"]
    assert spans[1]["delayqueue.due_ms"] == T0 + 86_400_000
    assert spans[1]["delayqueue.lateness_ms"] == 3


@pytest.mark.parametrize("when", ["start", "end"])
def test_a_failing_span_processor_never_fails_a_schedule(
    make_queue: Any,
    traced: Traced,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    when: str,
) -> None:
    """The producer's side of the same promise: the view's schedule goes through, untraced,
    the SDK's failure logged once."""
    monkeypatch.setattr(tracing, "_failure_logged", False)
    traced.provider.add_span_processor(_RaisingProcessor(when))
    q: Queue = make_queue("orders")
    q.schedule(1, id="m1")
    q.schedule_many([{"payload": 2, "id": "m2"}])
    assert q.counts()["pending"] + q.counts()["ready"] == 2
    failures = [r for r in caplog.records if r.name == tracing.__name__]
    assert len(failures) == 1 and failures[0].levelname == "WARNING"


def test_a_failure_aborted_before_its_nack_ends_its_span_as_stopped(
    make_queue: Any, redis_client: redis.Redis, traced: Traced
) -> None:
    """Issue 36 §4: a delivery span ended as its handler ended, so an abort that landed
    before the nack (nack.lua dead-letters it as aborted) left a span saying "retry". A
    failure's span now ends once its nack replied, at the instant its handler ended: an
    abort's "stopped"; one nack.lua did not find aborted keeps its "retry"."""
    from django_delayqueue.core.consumer.delivery import _end_span
    from django_delayqueue.core.consumer.outcomes import RETRY, Outcome
    from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
    from django_delayqueue.core.scripts.calls import ScriptBatch

    q: Queue = make_queue("orders", max_attempts=3)
    q.schedule_many([{"payload": 1, "id": "m0"}, {"payload": 2, "id": "m1"}])
    q.promote()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    for m in sorted(q.claim(2), key=lambda m: m.id):
        span = tracing.delivery_started(m, q, q.clock)
        assert span is not None
        outcome = Outcome(m, RETRY, T0, T0, reason="ValueError: boom", error="ValueError")
        _end_span(span, q, outcome, None)
        unrecorded.extend([outcome])
    assert traced.spans("delayqueue.deliver orders") == []  # not ended before the nack
    assert q.abort("m0", "by staff").running
    batch = ScriptBatch()
    calls = unrecorded.add_to(batch, [q], T0, force=True)
    unrecorded.read(calls, batch.run(redis_client, raise_errors=False), T0)
    spans = {
        s.attributes["messaging.message.id"]: s
        for s in traced.spans("delayqueue.deliver orders")
        if s.attributes is not None
    }
    assert spans["m0"].attributes is not None and spans["m1"].attributes is not None
    assert spans["m0"].attributes["delayqueue.outcome"] == "stopped"
    assert spans["m0"].status.description == "aborted: by staff"  # the dead letter's reason
    assert spans["m1"].attributes["delayqueue.outcome"] == "retry"
    assert spans["m1"].status.description == "ValueError: boom"
