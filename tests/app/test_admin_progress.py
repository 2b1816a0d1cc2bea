"""Progress shown (issue 28): a real consumer's handler reports it and blocks; the queue page's
in-flight list (through the test client and in Chromium), ``queuestats`` and its JSON show it;
it is gone once the message is acked."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from admin_support import QUEUE, page
from django.core.management import call_command
from test_admin_browser import _log_in, _open, browser  # noqa: F401
from waiting import wait_until

from django_delayqueue.core import Message, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.monitoring.stats import collect

NOTE = "row 4,250 of 10,000 <b>"  # escaped on the page


class Reporting:
    """A consumer whose handler reports 42.5% and blocks until ``release`` is set."""

    def __init__(self, redis_client: redis.Redis) -> None:
        self.release, self.reported = threading.Event(), threading.Event()
        self.queue = Queue(
            redis_client, QUEUE, prefix="dq", settings=QueueSettings(visibility_timeout=30)
        )
        self.consumer = Consumer(
            [self.queue], self.handler, maintenance_seconds=0.05, name="worker-p"
        )
        self.message_id = self.queue.schedule({"order_id": 7}).id
        self.thread = threading.Thread(target=self.consumer.run, daemon=True)

    def handler(self, message: Message) -> Any:
        assert message.progress(10, "starting")
        assert message.progress(42.5, NOTE)  # the latest is what is sent
        self.reported.set()
        self.release.wait(60)


@pytest.fixture
def reporting(redis_client: redis.Redis) -> Iterator[Reporting]:
    r = Reporting(redis_client)
    r.thread.start()
    assert r.reported.wait(30)
    try:
        yield r
    finally:
        r.release.set()
        r.consumer.request_stop()
        r.thread.join(30)


def _with_progress(admin_client: Any) -> Any:
    response = admin_client.get(page(QUEUE, "unack"))
    rows = response.context["rows"]
    running = rows[0]["running"] if rows else None
    return response if running and running["progress"] else None


@pytest.mark.django_db
def test_the_in_flight_list_shows_percent_and_note_until_the_ack(
    admin_client: Any, redis_client: redis.Redis, reporting: Reporting
) -> None:
    response = wait_until(lambda: _with_progress(admin_client), 30, "the progress on the page")
    (row,) = response.context["rows"]
    assert row["id"] == reporting.message_id
    progress = row["running"]["progress"]
    assert (progress["percent"], progress["label"], progress["note"]) == (42.5, "42.5%", NOTE)
    html = response.content.decode().split('id="result_list"')[1]
    assert '<progress max="100" value="42.5">42.5%</progress>' in html
    assert "row 4,250 of 10,000 &lt;b&gt;" in html
    assert ">Progress<" in html

    # queuestats: the table's RUNNING column and the JSON.
    out = StringIO()
    call_command("queuestats", QUEUE, stdout=out)
    assert f"{QUEUE}:{reporting.message_id} for" in out.getvalue()
    assert f"at 42.5%: {NOTE}" in out.getvalue()
    out = StringIO()
    call_command("queuestats", QUEUE, "--json", stdout=out)
    (stats,) = json.loads(out.getvalue())["queues"]
    (consumer,) = [c for c in stats["consumers"] if c["name"] == "worker-p"]
    (running,) = consumer["running"]
    assert running["progress"]["percent"] == 42.5 and running["progress"]["note"] == NOTE

    reporting.release.set()
    wait_until(lambda: redis_client.zcard(reporting.queue.keys.unack) == 0)
    assert redis_client.exists(reporting.queue.keys.progress) == 0
    assert reporting.queue.progress_of(reporting.message_id) == {}


@pytest.mark.django_db
def test_a_message_that_reported_nothing_shows_a_dash(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    release, started = threading.Event(), threading.Event()

    def quiet(message: Message) -> None:
        started.set()
        release.wait(60)

    q = Queue(redis_client, QUEUE, prefix="dq", settings=QueueSettings(visibility_timeout=30))
    consumer = Consumer([q], quiet, maintenance_seconds=0.05, name="worker-q")
    q.schedule({"order_id": 8})
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert started.wait(30)

        def running_row() -> Any:
            response = admin_client.get(page(QUEUE, "unack"))
            rows = response.context["rows"]
            return response if rows and rows[0]["running"] else None

        response = wait_until(running_row, 30, "the running message in the heartbeat")
        assert response.context["rows"][0]["running"]["progress"] is None
        assert redis_client.exists(q.keys.progress) == 0  # nothing reported, nothing written
    finally:
        release.set()
        consumer.request_stop()
        thread.join(30)


@pytest.mark.django_db(transaction=True)
def test_the_progress_bar_in_the_browser(
    browser: Any,  # noqa: F811
    live_server: Any,
    django_user_model: Any,
    reporting: Reporting,
) -> None:
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    # Listed by the consumer's heartbeat, its report sent: what the page reads.
    wait_until(lambda: any(r.progress for r in collect([QUEUE])[0].running), 30, "the report")
    _log_in(browser, live_server.url)
    row_css = f'tr[data-id="{reporting.message_id}"]'
    _open(browser, f"{live_server.url}{page(QUEUE, 'unack')}", f"{row_css} td.dq-progress")
    cell = browser.find_element(By.CSS_SELECTOR, f"{row_css} td.dq-progress")
    bar = cell.find_element(By.TAG_NAME, "progress")
    assert bar.get_attribute("value") == "42.5" and bar.get_attribute("max") == "100"
    assert cell.find_element(By.CSS_SELECTOR, ".dq-progress-percent").text == "42.5%"
    assert cell.find_element(By.CSS_SELECTOR, ".dq-progress-note").text == NOTE
    header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")]
    assert "PROGRESS" in [name.upper() for name in header]  # the admin's CSS upper-cases it
