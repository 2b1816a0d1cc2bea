"""The admin's "Stop" of an in-flight message (issue 26): in Chromium against a running worker,
and its permission and "not running" answers through the test client.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from admin_support import action_url, client_for, make_user, page
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.test import override_settings
from test_admin_browser import _log_in, _open, _wait_for, browser  # noqa: F401
from waiting import TIMEOUT, wait_until

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.worker import Worker

QUEUE = "stoppable"
KEYS = QueueKeys("dq", QUEUE)


@pytest.fixture(autouse=True)
def stoppable_queue() -> Iterator[None]:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"abort_grace_seconds": 600}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        queue_overrides.forget()
        yield
    queue_overrides.forget()


@pytest.fixture
def cooperative_worker() -> Iterator[Callable[[], threading.Event]]:
    """A worker whose handler runs until its message is aborted; returns "started"."""
    started = threading.Event()
    workers: list[tuple[Worker, threading.Thread]] = []

    def handler(message: dq.Message, **kwargs: Any) -> None:
        started.set()
        while not message.aborted:
            threading.Event().wait(0.01)

    def start() -> threading.Event:
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        workers.append((worker, thread))
        return started

    dq.topic(QUEUE).connect(handler, weak=False)
    yield start
    dq.topic(QUEUE).disconnect(handler)
    for worker, thread in workers:
        worker.request_stop()
        thread.join(TIMEOUT)


@pytest.mark.django_db(transaction=True)
def test_stop_a_running_message_in_the_browser(
    browser: Any,  # noqa: F811
    live_server: Any,
    redis_client: redis.Redis,
    django_user_model: Any,
    cooperative_worker: Any,
) -> None:
    from selenium.webdriver.common.by import By

    boss = django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    dq.schedule(QUEUE, {"report": "yearly"}, id="job-1")
    assert cooperative_worker().wait(TIMEOUT)
    _log_in(browser, live_server.url)
    _open(browser, f"{live_server.url}{page(QUEUE, 'unack')}", 'tr[data-id="job-1"]')
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-id="job-1"]')
    row.find_element(By.CSS_SELECTOR, 'button[data-action="stop"]').click()
    message = _wait_for(browser, "ul.messagelist li")
    assert "Asked 1 running message(s) to stop" in message.text
    wait_until(lambda: redis_client.zscore(KEYS.garbage, "job-1") is not None)
    assert redis_client.hget(KEYS.reasons, "job-1") == b"aborted: stopped by boss in the admin"
    (entry,) = LogEntry.objects.filter(user=boss)
    assert entry.object_repr == f"{QUEUE}/job-1"
    assert entry.change_message == "Stop: stopped by boss in the admin"


@pytest.mark.django_db(transaction=True)
def test_stop_needs_the_change_permission(
    redis_client: redis.Redis, django_user_model: Any
) -> None:
    q = dq.get_queue(QUEUE)
    q.schedule({}, id="run-1")
    assert q.shards[0].claim(1)
    viewer = make_user(django_user_model, "viewer", "django_delayqueue.view_queuemessage")
    response = client_for(viewer).post(action_url("stop", QUEUE), {"id": "run-1", "state": "unack"})
    assert response.status_code == 403
    assert redis_client.hlen(KEYS.aborts) == 0
    viewer_page = client_for(viewer).get(page(QUEUE, "unack"))
    assert b'data-action="stop"' not in viewer_page.content


@pytest.mark.django_db(transaction=True)
def test_stop_of_a_message_that_is_not_running_says_so(
    redis_client: redis.Redis, django_user_model: Any
) -> None:
    dq.schedule(QUEUE, {}, id="later", delay=3600)
    staff = make_user(
        django_user_model,
        "staff",
        "django_delayqueue.view_queuemessage",
        "django_delayqueue.change_queuemessage",
    )
    client = client_for(staff)
    response = client.post(
        action_url("stop", QUEUE), {"ids": ["later", "gone"], "state": "unack"}, follow=True
    )
    texts = [str(m) for m in response.context["messages"]]
    assert texts == [
        f"Not stopped: message 'later' of queue '{QUEUE}' is not running: it is waiting for "
        "its due time (cancel it instead).",
        f"Not stopped: message 'gone' of queue '{QUEUE}' is not running: there is no such "
        "message (done, or never scheduled).",
    ]
    assert redis_client.zscore(KEYS.pending, "later") is not None
    assert not LogEntry.objects.exists()
