"""The queue page's consumer processes and running messages (admin/running.py): a real
consumer heartbeats on the test Redis while its handler blocks past the queue's time limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from admin_support import QUEUE, page
from django.conf import settings
from django.test import override_settings
from waiting import wait_until

from django_delayqueue.core import Message, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer

pytestmark = pytest.mark.django_db


@pytest.fixture
def limited() -> Iterator[None]:
    queues = {**settings.DELAYQUEUE["QUEUES"]}
    queues[QUEUE] = {**queues[QUEUE], "time_limit": 1}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        yield


@pytest.fixture
def blocked(redis_client: redis.Redis) -> Iterator[tuple[Consumer, str]]:
    """A consumer whose handler blocks until the test ends, on one message of QUEUE."""
    release, started = threading.Event(), threading.Event()

    def handler(message: Message) -> Any:
        started.set()
        release.wait(60)

    q = Queue(redis_client, QUEUE, prefix="dq", settings=QueueSettings(visibility_timeout=30))
    consumer = Consumer([q], handler, maintenance_seconds=0.05, name="worker-x")
    message_id = q.schedule({"order_id": 7}).id
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield consumer, message_id
    finally:
        release.set()
        consumer.request_stop()
        thread.join(30)


def test_in_flight_tab_shows_how_long_a_message_runs_its_limit_and_its_process(
    admin_client: Any, limited: None, blocked: tuple[Consumer, str]
) -> None:
    _, message_id = blocked

    def stalled_page() -> Any:
        response = admin_client.get(page(QUEUE, "unack"))
        return response if response.context["stalled"] == 1 else None

    response = wait_until(stalled_page, 30, "the running message past its limit")
    (row,) = response.context["rows"]
    assert row["id"] == message_id
    assert row["running"]["consumer"] == "worker-x" and row["running"]["stalled"]
    assert row["running"]["limit"] == "1 s"
    html = response.content.decode()
    assert 'id="dq-stalled"' in html and "1 stalled" in html  # at the top, whatever the tab
    assert 'class="dq-badge-stalled"' in html.split('id="result_list"')[1]  # on its row
    (group,) = response.context["supervisors"]
    (process,) = group["processes"]
    assert group["supervisor"] is None and process["name"] == "worker-x"
    assert process["running"] == 1 and process["pid"] is not None
    # The top count shows on the other tabs too.
    assert 'id="dq-stalled"' in admin_client.get(page(QUEUE, "pending")).content.decode()


def test_nothing_is_flagged_without_a_time_limit(
    admin_client: Any, blocked: tuple[Consumer, str]
) -> None:
    _, _message_id = blocked

    def running_row() -> Any:
        response = admin_client.get(page(QUEUE, "unack"))
        rows = response.context["rows"]
        return response if rows and rows[0]["running"] else None

    response = wait_until(running_row, 30, "the running message in the heartbeat")
    assert response.context["stalled"] == 0
    assert response.context["rows"][0]["running"]["limit"] == "—"
    assert 'id="dq-stalled"' not in response.content.decode()
