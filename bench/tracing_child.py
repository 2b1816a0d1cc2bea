"""One process of the tracing bench (bench/tracing.py): ``python -m bench.tracing_child MODE
COUNT REDIS_URL`` prints, as JSON, this process's CPU time (µs per message) of

- ``deliver``: ``Consumer.deliver`` of messages carrying a trace context, no-op handler, no
  Redis (what bench/deliver_micro.py measures);
- ``burst``: a burst consumer delivering COUNT such messages through Redis (claims, acks);
- ``schedule``: ``Queue.schedule`` of COUNT messages (one script call each), inside a span
  where there is a tracer.

MODE: ``absent`` (OpenTelemetry hidden: as without the ``otel`` extra), ``api`` (installed, no
SDK: the API's no-op provider) or ``sdk`` (the SDK's TracerProvider, a BatchSpanProcessor and
an exporter that drops every span: the cost of making spans, not of shipping them).
CPU time (``time.process_time``) rather than wall time: the machine is shared; it includes the
span processor's thread.
"""

from __future__ import annotations

import json
import sys
import time

MODE, COUNT, URL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if MODE == "absent":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]

import redis  # noqa: E402

from django_delayqueue.core import Message, Queue, SystemClock  # noqa: E402
from django_delayqueue.core.consumer.loop import Consumer  # noqa: E402
from django_delayqueue.core.envelope import encode_envelope  # noqa: E402
from django_delayqueue.core.results import Prepared  # noqa: E402

# A producer's span context, as the envelopes of a traced application carry it.
TRACE = "0af7651916cd43dd8448eb211c80319cb7ad6b716920333101"


def set_up() -> object:
    """The mode's tracer provider; a span to schedule in (None: no tracer)."""
    if MODE != "sdk":
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
    return trace.get_tracer("bench")


def cpu_us(work: object, count: int) -> float:
    started = time.process_time()
    work()  # type: ignore[operator]
    return (time.process_time() - started) / count * 1e6


def main() -> None:
    tracer = set_up()
    client = redis.Redis.from_url(URL)
    name = f"tracing-{MODE}"
    q = Queue(client, name, clock=SystemClock())
    consumer = Consumer([q], lambda m: None)
    messages = [Message(f"m{i}", name, None, 0, 0, 1, str(i), trace=TRACE) for i in range(COUNT)]
    # What the handler threads call: the consumer's delivery part (the consumer itself before).
    deliver = getattr(consumer, "_delivery", consumer).deliver

    def delivering() -> None:
        for m in messages:
            deliver(m)

    delivering()  # warm up (and the tracer looked for)
    out = {"deliver": cpu_us(delivering, COUNT)}

    now = q.clock.now_ms()
    envelope = encode_envelope("null", now, now, trace=TRACE)
    q.schedule_prepared([Prepared(f"b{i}", now, envelope) for i in range(COUNT)])
    out["burst"] = cpu_us(lambda: Consumer([q], lambda m: None, burst=True).run(), COUNT)
    assert q.counts()["ready"] == 0

    def scheduling() -> None:
        for i in range(COUNT):
            q.schedule(None, id=f"s{i}", delay=3600)

    if tracer is None:
        out["schedule"] = cpu_us(scheduling, COUNT)
    else:
        with tracer.start_as_current_span("request"):  # type: ignore[attr-defined]
            out["schedule"] = cpu_us(scheduling, COUNT)
    client.delete(*q.keys.all_keys())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
