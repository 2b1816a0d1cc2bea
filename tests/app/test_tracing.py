"""OpenTelemetry from the view to the handler: a view schedules inside a span (through the
outbox), a real ``manage.py runqueue`` process delivers, and its spans (the SDK set up in its
AppConfig, written to a file) are read back: linked to the view's trace, with the messaging
attributes, an exception recorded on a failing attempt; the same for a ``@task``, and for
``runqueue`` without OpenTelemetry installed at all.

The test process keeps its spans in memory (tests/support/tracing_support.py); the child's
settings are tests/support/tracing_settings.py, its receivers and task tracing_app.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import tracing_urls
from django.conf import settings
from django.db import transaction
from django.test import Client, override_settings
from paths import PROGRAMS, ROOT, child_pythonpath
from tracing_app.notes import DELIVERED
from tracing_settings import TRACED_QUEUES, TRACED_TASKS
from tracing_support import Traced, hex_id, read_spans, tracing_on

import django_delayqueue as dq
from django_delayqueue.checks import check_settings
from django_delayqueue.core import QueueKeys
from django_delayqueue.core.envelope import decode_envelope_parts
from django_delayqueue.core.observability import tracing
from django_delayqueue.core.observability.trace_context import parse_trace
from django_delayqueue.models import OutboxMessage
from django_delayqueue.worker import Worker

WAIT = 120  # bound on a child process


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    for t in tracing_on(monkeypatch):
        monkeypatch.setattr(tracing_urls, "TRACER", t.tracer)
        yield t


@pytest.fixture(autouse=True)
def traced_queues() -> Iterator[None]:
    queues = {**settings.DELAYQUEUE["QUEUES"], **TRACED_QUEUES}
    with override_settings(
        DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues},
        TASKS=TRACED_TASKS,
        ROOT_URLCONF="tracing_urls",
    ):
        yield


def runqueue(
    tmp_path: Path, redis_url: str, *, spans: Path | None, parent: str = "link", hide: bool = False
) -> subprocess.CompletedProcess[str]:
    """``manage.py runqueue --burst`` on the traced queues; ``hide``: with OpenTelemetry hidden
    (tests/support/programs/without_otel.py)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tracing_settings",
        "REDIS_URL": redis_url,
        "PYTHONPATH": child_pythonpath(),
        "DEMO_DB": str(tmp_path / "db.sqlite3"),
        "TRACING_PARENT": parent,
    }
    env.pop("TRACING_SPANS", None)
    if spans is not None:
        env["TRACING_SPANS"] = str(spans)
    program = [str(PROGRAMS / "without_otel.py")] if hide else []
    command = [*program, str(ROOT / "manage.py"), "runqueue", "traced", "traced-async"]
    done = subprocess.run(
        [sys.executable, *command, "traced-tasks", "--burst", "-v", "2"],
        env=env, capture_output=True, text=True, timeout=WAIT, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def notes(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(n) for n in client.lrange(DELIVERED, 0, -1)]


def by_message(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["attributes"]["messaging.message.id"]: s for s in spans}


@pytest.mark.django_db(transaction=True)
def test_a_views_trace_reaches_the_handler_run_by_runqueue(
    traced: Traced, redis_client: redis.Redis, redis_server: Any, tmp_path: Path
) -> None:
    web = Client()
    ok = web.post("/close-later/traced/1").json()
    failing = web.post("/close-later/traced/2?fail=1").json()
    on_loop = web.post("/close-later/traced-async/3").json()
    producers = {
        s.attributes["messaging.message.id"]: s  # type: ignore[index]
        for s in traced.spans()
        if s.name.startswith("delayqueue.schedule ")
    }
    assert set(producers) == {ok["id"], failing["id"], on_loop["id"]}

    spans_file = tmp_path / "spans.jsonl"
    done = runqueue(tmp_path, redis_server.url, spans=spans_file)
    delivered = by_message(read_spans(spans_file, "delayqueue.deliver traced"))
    delivered |= by_message(read_spans(spans_file, "delayqueue.deliver traced-async"))
    assert set(delivered) == set(producers), done.stderr[-3000:]
    for view in (ok, failing, on_loop):
        span, producer = delivered[view["id"]], producers[view["id"]]
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["parent_id"] is None  # linked, not a child: a trace of its own
        (link,) = span["links"]
        assert link["context"]["trace_id"] == view["trace_id"]
        assert link["context"]["span_id"] == hex_id(producer.context.span_id, 16)
        assert span["context"]["trace_id"] != view["trace_id"]
        attributes = span["attributes"]
        assert attributes["messaging.system"] == "delayqueue"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["messaging.delayqueue.message.delivery_count"] == 1
        assert attributes["delayqueue.due_ms"] == producer.attributes["delayqueue.due_ms"]  # type: ignore[index]
        assert attributes["delayqueue.lateness_ms"] >= 0
    assert delivered[ok["id"]]["attributes"]["delayqueue.outcome"] == "ack"
    assert delivered[ok["id"]]["status"]["status_code"] == "UNSET"
    assert delivered[on_loop["id"]]["attributes"]["messaging.destination.name"] == "traced-async"
    # The failing attempt: its exception on the span, status ERROR, retried (in an hour).
    failed = delivered[failing["id"]]
    assert failed["attributes"]["delayqueue.outcome"] == "retry"
    assert failed["status"]["status_code"] == "ERROR"
    (event,) = failed["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "order 2 cannot be closed"
    # The handlers ran inside their delivery spans: their own span is its child.
    work = {s["parent_id"]: s for s in read_spans(spans_file, "handler work")}
    for span in delivered.values():
        assert (
            work[span["context"]["span_id"]]["context"]["trace_id"] == span["context"]["trace_id"]
        )
    seen = {n["payload"]["order"]: n["trace_id"] for n in notes(redis_client)}
    assert seen == {
        o: delivered[v["id"]]["context"]["trace_id"]
        for o, v in [(1, ok), (2, failing), (3, on_loop)]
    }


@pytest.mark.django_db(transaction=True)
def test_child_mode_keeps_the_delivery_in_the_views_trace(
    traced: Traced, redis_server: Any, tmp_path: Path
) -> None:
    view = Client().post("/close-later/traced/1").json()
    producer = traced.one("delayqueue.schedule traced")
    spans_file = tmp_path / "spans.jsonl"
    runqueue(tmp_path, redis_server.url, spans=spans_file, parent="child")
    (span,) = read_spans(spans_file, "delayqueue.deliver traced")
    assert span["context"]["trace_id"] == view["trace_id"]
    assert span["parent_id"] == hex_id(producer.context.span_id, 16)
    assert span["links"] == []


@pytest.mark.django_db(transaction=True)
def test_a_tasks_trace_reaches_the_task_run_by_runqueue(
    traced: Traced, redis_client: redis.Redis, redis_server: Any, tmp_path: Path
) -> None:
    web = Client()
    ok = web.post("/close-task-later/7").json()
    failing = web.post("/close-task-later/8?fail=1").json()
    producers = {
        s.attributes["messaging.message.id"]: s  # type: ignore[index]
        for s in traced.spans("delayqueue.schedule traced-tasks")
    }
    assert set(producers) == {ok["id"], failing["id"]}
    assert producers[ok["id"]].attributes["delayqueue.task"] == "tracing_app.tasks.close_order"  # type: ignore[index]

    spans_file = tmp_path / "spans.jsonl"
    done = runqueue(tmp_path, redis_server.url, spans=spans_file)
    delivered = by_message(read_spans(spans_file, "delayqueue.deliver traced-tasks"))
    assert set(delivered) == set(producers), done.stderr[-3000:]
    for view in (ok, failing):
        (link,) = delivered[view["id"]]["links"]
        assert link["context"]["trace_id"] == view["trace_id"]
        assert link["context"]["span_id"] == hex_id(producers[view["id"]].context.span_id, 16)
    assert delivered[ok["id"]]["attributes"]["delayqueue.outcome"] == "ack"
    failed = delivered[failing["id"]]
    assert failed["attributes"]["delayqueue.outcome"] == "retry"
    assert failed["status"]["status_code"] == "ERROR"
    assert [e["attributes"]["exception.message"] for e in failed["events"]] == [
        "order 8 cannot be closed"
    ]
    work = {s["parent_id"]: s for s in read_spans(spans_file, "task work")}
    assert {work[s["context"]["span_id"]]["context"]["trace_id"] for s in delivered.values()} == {
        s["context"]["trace_id"] for s in delivered.values()
    }


@pytest.mark.django_db(transaction=True)
def test_runqueue_without_opentelemetry_delivers_traced_messages_as_before(
    traced: Traced, redis_client: redis.Redis, redis_server: Any, tmp_path: Path
) -> None:
    web = Client()
    ok = web.post("/close-later/traced/1").json()
    failing = web.post("/close-later/traced/2?fail=1").json()
    runqueue(tmp_path, redis_server.url, spans=None, hide=True)
    assert sorted((n["id"], n["trace_id"], n["hidden"]) for n in notes(redis_client)) == sorted(
        [(ok["id"], None, True), (failing["id"], None, True)]
    )
    keys = QueueKeys("dq", "traced")
    assert redis_client.hlen(keys.messages) == 1  # the failed one, retrying
    assert redis_client.zrange(keys.retry, 0, -1) == [failing["id"].encode()]


@pytest.mark.django_db(transaction=True)
def test_the_outbox_row_keeps_the_context_of_the_schedule(
    traced: Traced, redis_client: redis.Redis
) -> None:
    # Captured when dq.schedule is called, not when the row is sent after the commit (by the
    # commit's hook or, Redis down then, by a relay in another process): the row's envelope.
    with traced.tracer.start_as_current_span("view"), transaction.atomic():
        message_id = dq.schedule("traced", {"order": 5})
        row = OutboxMessage.objects.get(message_id=message_id)
    producer = traced.one("delayqueue.schedule traced").context
    parsed = parse_trace(decode_envelope_parts(row.envelope).trace)
    assert parsed is not None and parsed[:2] == (producer.trace_id, producer.span_id)
    assert (
        redis_client.hget(QueueKeys("dq", "traced").messages, message_id) == row.envelope.encode()
    )


@pytest.mark.parametrize("value", ["sibling", None, 1])
def test_an_unknown_otel_parent_is_reported_by_the_checks(value: Any) -> None:
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OTEL_PARENT": value}):
        (found,) = check_settings()
    assert found.id == "delayqueue.E004" and "OTEL_PARENT" in found.msg


def test_the_worker_takes_otel_parent_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_parent", "link")
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OTEL_PARENT": "child"}):
        Worker.for_queues(["traced"], burst=True)
    assert tracing._parent == "child"
