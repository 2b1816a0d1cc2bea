"""The queue page's charts: those of the last hour, drawn on the server as inline SVG from the
consumers' minute counts (admin/charts.py), and the last queue_report's PNG charts from
DELAYQUEUE["REPORT_DIR"]."""

from __future__ import annotations

from typing import Any

import pytest
from admin_support import OVERVIEW, QUEUE, client_for, make_user, page
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from django_delayqueue.core import Queue
from django_delayqueue.core.envelope import ms_to_datetime
from django_delayqueue.core.timings.recorder import MINUTE_MS
from django_delayqueue.spark.chart_files import chart_names

pytestmark = pytest.mark.django_db

PNG = b"\x89PNG\r\n\x1a\n" + b"fake chart body"


@pytest.fixture
def report_dir(tmp_path, redis_client):
    (tmp_path / "charts").mkdir()
    (tmp_path / "charts" / chart_names(QUEUE)["lateness"]).write_bytes(PNG)
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "REPORT_DIR": str(tmp_path)}):
        yield tmp_path


def chart_url(kind: str, queue: str = QUEUE) -> str:
    return f"{OVERVIEW}{queue}/charts/{kind}.png"


def test_queue_page_links_the_charts_the_report_drew(admin_client, report_dir):
    response = admin_client.get(page())
    assert [c["kind"] for c in response.context["charts"]] == ["lateness"]  # outcomes not drawn
    assert chart_url("lateness").encode() in response.content


def test_chart_is_served_as_png_to_a_viewer(django_user_model, report_dir):
    viewer = make_user(django_user_model, "viewer", "django_delayqueue.view_queuemessage")
    response = client_for(viewer).get(chart_url("lateness"))
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert b"".join(response.streaming_content) == PNG


@pytest.mark.parametrize("kind", ["outcomes", "secrets", "..%2F..%2Fsettings"])
def test_missing_or_unknown_chart_is_404(admin_client, report_dir, kind):
    assert admin_client.get(chart_url(kind)).status_code == 404


def test_chart_needs_the_view_permission(django_user_model, report_dir):
    staff = make_user(django_user_model, "staff")
    assert client_for(staff).get(chart_url("lateness")).status_code == 403
    anonymous = client_for(None).get(chart_url("lateness"))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_no_report_dir_means_no_charts(admin_client, redis_client):
    assert admin_client.get(page()).context["charts"] == []
    assert admin_client.get(chart_url("lateness")).status_code == 404


# --- the charts of the last hour, drawn on the server ------------------------------------------


def record_minute(client: Any, queue: str, minute: int, fields: dict[str, int]) -> None:
    """Counts in one minute's timings hash, as consumers flush them (core.timings)."""
    keys = Queue(client, queue, prefix="dq").keys
    for name, value in fields.items():
        client.hincrby(keys.timings_minute(minute), name, value)


def this_minute(client: Any) -> int:
    seconds, micros = client.time()
    return (seconds * 1000 + micros // 1000) // MINUTE_MS


def label(minute: int) -> str:
    return f"{timezone.localtime(ms_to_datetime(minute * MINUTE_MS)):%H:%M}"


def charts_of(html: str) -> dict[str, str]:
    """Each live chart's markup, by kind."""
    box = html.split('id="dq-charts"', 1)[1].split('<p class="help">', 1)[0]
    parts = box.split('<figure class="dq-chart" data-chart="')[1:]
    return {part.split('"', 1)[0]: part for part in parts}


def test_the_queue_page_draws_the_last_hour_inline_with_its_figures(admin_client, redis_client):
    from lateness_support import LATE_QUEUE, LATE_QUEUE_SETTINGS, deliver_late

    late = {**LATE_QUEUE_SETTINGS, "lateness_warning_ms": 20}
    queues = {**settings.DELAYQUEUE["QUEUES"], LATE_QUEUE: late}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        deliver_late(redis_client, ["ok"] * 8 + ["reject", "flaky"], late_ms=30)
        minute = this_minute(redis_client)
        html = admin_client.get(page(LATE_QUEUE)).content.decode()
    drawn = charts_of(html)
    assert list(drawn) == ["deliveries", "lateness", "limit-wait"]
    for markup in drawn.values():  # SVG in the page: nothing fetched, no script
        assert "<svg" in markup and "<script" not in markup and "src=" not in markup
        assert 'aria-hidden="true"' in markup and '<table class="dq-chart-figures">' in markup
    # 9 acknowledged (the flaky one on its retry), the reject dead and the flaky's first try.
    deliveries = drawn["deliveries"]
    assert "9 delivered and 2 failed in the last hour" in deliveries
    row = deliveries.split(f'<th scope="row">{label(minute)}</th>', 1)[1].split("</tr>", 1)[0]
    assert row.split("<td>")[1:] == ["9</td>", "2</td>", "1</td>", "1</td>", "0</td>"]
    assert deliveries.count("<rect") == 2  # one minute: a bar of each
    # Lateness: the 10 first attempts 30 ms late, the retry at once, against the 20 ms warning.
    lateness = drawn["lateness"]
    assert 'class="dq-chart-warning"' in lateness and "warning 20 ms" in lateness
    row = lateness.split(f'<th scope="row">{label(minute)}</th>', 1)[1].split("</tr>", 1)[0]
    assert "<td>11</td>" in row and "<td>50 ms</td>" in row
    assert "p99 above the warning in 1 of 1 minutes" in lateness
    assert "no flow limit is set" in drawn["limit-wait"]


def test_each_minute_is_drawn_where_it_fell_and_limit_waits_are_charted(admin_client, redis_client):
    from django_delayqueue.core.timings.buckets import bucket_of

    now = this_minute(redis_client)
    ten_ago = now - 10
    record_minute(redis_client, QUEUE, ten_ago, {"o_ack": 4, "o_dead": 1, "w0": 2, "w12": 3})
    record_minute(redis_client, QUEUE, ten_ago, {"w_sum": 4500, f"l{bucket_of(3)}": 5})
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"rate_limit": "5/s"}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        html = admin_client.get(page()).content.decode()
    drawn = charts_of(html)
    row = drawn["deliveries"].split(f'<th scope="row">{label(ten_ago)}</th>', 1)[1]
    assert row.split("</tr>", 1)[0].split("<td>")[1:3] == ["4</td>", "1</td>"]
    # Its bar stands 10 minutes left of the newest slot (the page may have read a minute on).
    charts = admin_client.get(page()).context["live_charts"]
    (ok_bar,) = charts[0]["series"][0]["bars"]
    slot = (charts[0]["right"] - charts[0]["left"]) / 60
    assert round((charts[0]["right"] - ok_bar["x"]) / slot) in (11, 12)
    held = drawn["limit-wait"]
    assert "3 messages held, 4.5 s in all, in the last hour" in held
    row = held.split(f'<th scope="row">{label(ten_ago)}</th>', 1)[1].split("</tr>", 1)[0]
    assert "<td>3</td>" in row and "<td>4.5 s</td>" in row
    assert "no lateness_warning_ms set" in drawn["lateness"]


def test_a_queue_with_nothing_delivered_still_draws_its_charts(admin_client, redis_client):
    drawn = charts_of(admin_client.get(page()).content.decode())
    assert list(drawn) == ["deliveries", "lateness", "limit-wait"]
    assert "No deliveries in the last hour." in drawn["deliveries"]
    assert "No handler started in the last hour." in drawn["lateness"]
    assert "<rect" not in drawn["deliveries"] and "<polyline" not in drawn["lateness"]
