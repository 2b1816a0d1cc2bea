"""Lateness you can watch: the histograms and outcome counters a worker records reach the
Prometheus endpoint (from any process), OpenTelemetry metrics, the admin (p50/p99, the flag
past lateness_warning_ms), queuestats and, opted in, the health probe.

Deliveries run on a ManualClock (tests/support/lateness_support.py): every start lateness is
known to the millisecond, so each lands in a known bucket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from lateness_support import LATE_QUEUE, LATE_QUEUE_SETTINGS, deliver_late
from prometheus_client.parser import text_string_to_metric_families

import django_delayqueue as dq
from django_delayqueue.core.timings.buckets import BOUNDS_SECONDS

pytestmark = pytest.mark.django_db
METRICS = "/delayqueue/metrics/"
HEALTH = "/delayqueue/health/"
OVERVIEW = "/admin/django_delayqueue/queuemessage/"


def late_queue(**settings_of_queue: Any) -> Any:
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        LATE_QUEUE: {**LATE_QUEUE_SETTINGS, **settings_of_queue},
    }
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues})


@pytest.fixture(autouse=True)
def configured() -> Iterator[None]:
    with late_queue():
        yield


def scrape(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(METRICS)
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def bucket(m: dict[Any, float], name: str, le: str) -> float:
    return m[(f"{name}_bucket", (("le", le), ("queue", LATE_QUEUE)))]


# --- Prometheus ----------------------------------------------------------------------------------


def test_histograms_count_every_delivery_in_its_bucket(client: Any, redis_client: Any) -> None:
    # 20 acks, a rejected one (dead) and a flaky one (retried, then acked): 23 handler runs,
    # 22 of them 30 ms late, the retry 0 ms late (due at its retry time).
    deliver_late(redis_client, [*range(20), "reject", "flaky"], late_ms=30)
    m = scrape(client)
    lateness, queue = "delayqueue_start_lateness_seconds", (("queue", LATE_QUEUE),)
    assert m[(f"{lateness}_count", queue)] == 23
    assert bucket(m, lateness, "0.00025") == 1  # the retry
    assert bucket(m, lateness, "0.025") == 1
    assert bucket(m, lateness, "0.05") == 23  # 30 ms: in (25 ms, 50 ms]
    assert bucket(m, lateness, "+Inf") == 23
    assert m[(f"{lateness}_sum", queue)] == pytest.approx(22 * 0.030)
    assert m[("delayqueue_handler_duration_seconds_count", queue)] == 23
    outcomes = {
        o: m[("delayqueue_delivery_outcomes_total", (("outcome", o), ("queue", LATE_QUEUE)))]
        for o in ("ack", "retry", "dead", "stopped")
    }
    assert outcomes == {"ack": 21, "retry": 1, "dead": 1, "stopped": 0}
    # No flow limit on the queue: no limit-wait series.
    assert ("delayqueue_limit_wait_seconds_count", queue) not in m


def test_limit_wait_histogram_of_a_flow_limited_queue(client: Any, redis_client: Any) -> None:
    # What a consumer of a rate-limited queue flushes (tests/core/test_core_timings.py has a
    # real one): two messages, one held 30 ms by the limit, one not held.
    from django_delayqueue.core import QueueKeys
    from django_delayqueue.core.scripts.contracts import RECORD_TIMINGS
    from django_delayqueue.core.timings.buckets import bucket_of

    keys = QueueKeys("dq", LATE_QUEUE)
    increments = [f"w{bucket_of(30)}", 1, f"w{bucket_of(0)}", 1, "w_sum", 30, "o_ack", 2]
    RECORD_TIMINGS.call(
        keys, minute=keys.timings_minute(0), ttl_seconds=60, increments=increments
    ).run(redis_client)
    m = scrape(client)
    wait = "delayqueue_limit_wait_seconds"
    assert m[(f"{wait}_count", (("queue", LATE_QUEUE),))] == 2
    assert bucket(m, wait, "0.025") == 1 and bucket(m, wait, "0.05") == 2
    assert m[(f"{wait}_sum", (("queue", LATE_QUEUE),))] == pytest.approx(0.03)


def test_counters_add_up_over_runs_and_consumers(client: Any, redis_client: Any) -> None:
    deliver_late(redis_client, list(range(5)), late_ms=3)
    first = scrape(client)
    deliver_late(redis_client, list(range(7)), late_ms=3)  # another worker, later
    second = scrape(client)
    count = ("delayqueue_start_lateness_seconds_count", (("queue", LATE_QUEUE),))
    assert (first[count], second[count]) == (5, 12)


def test_a_runqueue_process_records_what_it_delivered(client: Any, redis_client: Any) -> None:
    q = dq.get_queue(LATE_QUEUE)
    q.schedule_many([{"payload": i} for i in range(4)])
    dq.topic(LATE_QUEUE).connect(_ack)
    try:
        call_command("runqueue", LATE_QUEUE, "--burst", "--verbosity", "0")
    finally:
        dq.topic(LATE_QUEUE).disconnect(_ack)
    m = scrape(client)
    assert m[("delayqueue_start_lateness_seconds_count", (("queue", LATE_QUEUE),))] == 4


def _ack(message: dq.Message, **kwargs: Any) -> None:
    return None


# --- OpenTelemetry metrics -----------------------------------------------------------------------


@pytest.fixture
def meter_reader() -> Iterator[Any]:
    """The SDK's InMemoryMetricReader on the global MeterProvider, as a site would set it.
    The API sets its global provider once per process: the flag is reset around the test, as
    OpenTelemetry's own test helpers do, so that other tests keep the default."""
    from opentelemetry import metrics
    from opentelemetry.metrics import _internal as api
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.util._once import Once

    reader = InMemoryMetricReader()
    saved = api._METER_PROVIDER_SET_ONCE, api._METER_PROVIDER
    api._METER_PROVIDER_SET_ONCE, api._METER_PROVIDER = Once(), None
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    try:
        yield reader
    finally:
        provider.shutdown()
        api._METER_PROVIDER_SET_ONCE, api._METER_PROVIDER = saved


def test_opentelemetry_histograms_with_our_buckets(meter_reader: Any, redis_client: Any) -> None:
    deliver_late(redis_client, [*range(10), "reject"], late_ms=7)
    found = {
        metric.name: metric
        for rm in meter_reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    (point,) = found["delayqueue.start_lateness"].data.data_points
    assert point.attributes["messaging.destination.name"] == LATE_QUEUE
    assert point.count == 11
    assert tuple(point.explicit_bounds) == BOUNDS_SECONDS
    assert point.bucket_counts[BOUNDS_SECONDS.index(0.01)] == 11  # 7 ms: in (5 ms, 10 ms]
    assert found["delayqueue.handler.duration"].data.data_points[0].count == 11
    outcomes = {
        p.attributes["outcome"]: p.value for p in found["delayqueue.outcomes"].data.data_points
    }
    assert outcomes == {"ack": 10, "dead": 1}


def test_without_a_meter_provider_nothing_is_recorded_through_opentelemetry() -> None:
    from django_delayqueue.core.timings.otel import OtelTimings

    assert OtelTimings.if_configured() is None  # the API's default provider: off


# --- the admin, queuestats, health -------------------------------------------------------------


def test_admin_shows_p50_p99_and_flags_a_late_queue(admin_client: Any, redis_client: Any) -> None:
    deliver_late(redis_client, list(range(20)), late_ms=30)
    with late_queue(lateness_warning_ms=20):
        overview = admin_client.get(OVERVIEW).content.decode()
        queue_page = admin_client.get(f"{OVERVIEW}{LATE_QUEUE}/").content.decode()
    row = overview.split(f'data-queue="{LATE_QUEUE}"', 1)[1].split("</tr>", 1)[0]
    # 30 ms in (25, 50]: p50 interpolated to 37.5 ms, p99 to 49.75 ms (one per line).
    assert ">p50 38 ms<" in row and ">p99 50 ms<" in row and "⚠ late" in row
    assert 'id="dq-lateness"' in queue_page and "above it" in queue_page
    with late_queue(lateness_warning_ms=60):
        overview = admin_client.get(OVERVIEW).content.decode()
    row = overview.split(f'data-queue="{LATE_QUEUE}"', 1)[1].split("</tr>", 1)[0]
    assert "p99 50 ms" in row and "⚠ late" not in row


@pytest.mark.django_db(transaction=True)
def test_a_warning_set_in_the_admin_is_followed_at_once(
    admin_client: Any, redis_client: Any
) -> None:
    from django_delayqueue.mirror.following import sync_settings
    from django_delayqueue.models import QueueConfig

    deliver_late(redis_client, list(range(10)), late_ms=30)
    sync_settings()  # the queue's row, as migrate or runqueue makes it
    overview = admin_client.get(OVERVIEW).content.decode()
    assert "⚠ late" not in overview  # no warning in the settings file
    row = QueueConfig.objects.get(name=LATE_QUEUE)
    row.lateness_warning_ms = 20
    row.full_clean()
    row.save()  # published to Redis on commit
    overview = admin_client.get(OVERVIEW).content.decode()
    late_row = overview.split(f'data-queue="{LATE_QUEUE}"', 1)[1].split("</tr>", 1)[0]
    assert "⚠ late" in late_row


def test_queuestats_shows_lateness_and_the_flag(redis_client: Any) -> None:
    deliver_late(redis_client, list(range(10)), late_ms=30)
    with late_queue(lateness_warning_ms=20):
        out, err = StringIO(), StringIO()
        call_command("queuestats", LATE_QUEUE, stdout=out, stderr=err)
        text = out.getvalue()
        assert "LATENESS 5 MIN" in text and "p50 38 ms, p99 50 ms" in text
        assert f"queue {LATE_QUEUE}: p99 start lateness" in err.getvalue()
        out = StringIO()
        call_command("queuestats", LATE_QUEUE, "--json", stdout=out, stderr=StringIO())
    (queue,) = json.loads(out.getvalue())["queues"]
    lateness = queue["lateness"]
    assert lateness["flagged"] is True and lateness["deliveries_5m"] == 10
    assert lateness["p99_ms_5m"] == pytest.approx(49.75)


def test_health_fails_on_lateness_only_when_opted_in(client: Any, redis_client: Any) -> None:
    deliver_late(redis_client, list(range(10)), late_ms=30)
    with late_queue(lateness_warning_ms=20):
        default = client.get(HEALTH).json()
        assert "lateness" not in default["checks"]
        assert default["queues"][LATE_QUEUE]["lateness"]["flagged"] is True
        with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "HEALTH_LATENESS": True}):
            response = client.get(HEALTH)
    assert response.status_code == 503
    check = response.json()["checks"]["lateness"]
    assert check["ok"] is False and LATE_QUEUE in check["failing"]
    # Evaluated in order: the second override reads the settings the first one made.
    with (
        late_queue(lateness_warning_ms=60),
        override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "HEALTH_LATENESS": True}),
    ):
        assert client.get(HEALTH).json()["checks"]["lateness"]["ok"] is True


def test_a_bad_warning_is_refused_by_the_checks() -> None:
    from django_delayqueue.checks.queues import queue_errors

    with late_queue(lateness_warning_ms=-5):
        errors = queue_errors(LATE_QUEUE)
    assert [e.id for e in errors] == ["delayqueue.E003"]
    assert "lateness_warning_ms" in errors[0].msg
