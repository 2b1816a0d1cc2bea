"""The queue page shows the last queue_report's charts from DELAYQUEUE["REPORT_DIR"]."""

from __future__ import annotations

import pytest
from admin_support import OVERVIEW, QUEUE, client_for, make_user, page
from django.conf import settings
from django.test import override_settings

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
