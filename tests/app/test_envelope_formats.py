"""Envelope formats on the Django side (docs/upgrades.md): ENVELOPE_FORMAT pins runqueue's
consumer; the admin, queuestats, the health probe and the check W010 say what waits for a newer
consumer and which live consumers are older than this release; E016 refuses a bad setting."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from admin_support import OVERVIEW, QUEUE, page
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_delayqueue.checks import check_envelope_formats, check_settings
from django_delayqueue.core import Queue
from django_delayqueue.core.consumer.rounds.details import heartbeat_details
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, encode_envelope
from django_delayqueue.core.results import Prepared
from django_delayqueue.worker import Worker

pytestmark = pytest.mark.django_db

NEW, PREVIOUS = ENVELOPE_FORMAT, ENVELOPE_FORMAT - 1
HEALTH = "/delayqueue/health/"


def delayqueue(**extra: Any) -> Any:
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, **extra})


@pytest.fixture
def q(redis_client: Any) -> Queue:
    return Queue(redis_client, QUEUE, prefix="dq")


def leave(q: Queue, count: int, format: int = NEW) -> None:
    """``count`` messages of ``format`` a consumer reading only the previous one left."""
    now = q.clock.now_ms()
    for i in range(count):
        envelope = encode_envelope(json.dumps(i), now, now, format=format)
        q.send_prepared(Prepared(f"new-{i}", now, envelope))
    assert q.claim(count, reads_format=format - 1) == []


def beat(q: Queue, name: str, reads_format: int | None) -> None:
    """A live consumer's heartbeat; ``reads_format`` None: a release before formats had
    numbers (its details announce none)."""
    q.client.zadd(q.keys.heartbeats, {name: q.clock.now_ms()})
    if reads_format is None:
        details = json.dumps({"pid": 1, "host": "h", "running": []})
    else:
        details = heartbeat_details(q.name, 0, [], reads_format=reads_format)
    q.client.hset(q.keys.consumer_details, name, details)


def test_envelope_format_pins_runqueues_consumer_and_its_announcement() -> None:
    assert Worker.for_queues([QUEUE]).reads_format == NEW
    with delayqueue(ENVELOPE_FORMAT=PREVIOUS):
        worker = Worker.for_queues([QUEUE])
        assert worker.reads_format == PREVIOUS
        announced = json.loads(worker.heartbeat_details(worker.queues[0]) or "{}")
        assert announced["reads_format"] == PREVIOUS


@pytest.mark.parametrize("value", [0, NEW + 1, "2", 1.5])
def test_a_bad_envelope_format_is_e016(value: Any) -> None:
    with delayqueue(ENVELOPE_FORMAT=value):
        errors = [e for e in check_settings() if e.id == "delayqueue.E016"]
        assert len(errors) == 1
        assert "DELAYQUEUE['ENVELOPE_FORMAT'] must be" in errors[0].msg
        assert Worker.for_queues([QUEUE]).reads_format == NEW  # runqueue still reads all


def test_the_admin_says_how_many_messages_wait_for_a_newer_consumer(
    admin_client: Any, q: Queue
) -> None:
    leave(q, 3)
    beat(q, "old-runqueue", PREVIOUS)
    response = admin_client.get(OVERVIEW)
    (banner,) = response.context["format_banners"]
    assert banner["queue"] == QUEUE and banner["stuck"]
    text = (
        f"3 messages wait for a newer consumer (envelope format {NEW}; the live consumers "
        f"read up to {PREVIOUS})"
    )
    assert text in banner["text"]
    assert f"1 live consumer read envelope formats up to {PREVIOUS}" in banner["text"]
    assert text in response.content.decode()
    html = admin_client.get(page(QUEUE, "retry")).content.decode()
    assert 'id="dq-formats"' in html and text in html
    # The reason on each message says why it waits.
    assert f"waits for a consumer that reads envelope format {NEW}" in html


def test_no_banner_when_every_consumer_reads_every_format(admin_client: Any, q: Queue) -> None:
    beat(q, "runqueue", NEW)
    response = admin_client.get(OVERVIEW)
    assert response.context["format_banners"] == []
    assert 'id="dq-formats"' not in admin_client.get(page(QUEUE)).content.decode()


def test_the_health_probe_fails_while_no_live_consumer_reads_what_waits(
    client: Any, q: Queue
) -> None:
    leave(q, 2)
    beat(q, "old-runqueue", PREVIOUS)
    beat(q, "older-runqueue", None)  # a release before formats had numbers: format 1
    response = client.get(HEALTH)
    assert response.status_code == 503
    check = response.json()["checks"]["envelope_formats"]
    assert not check["ok"] and check["format"] == NEW
    assert check["failing"] == {
        QUEUE: f"2 messages wait for a newer consumer (envelope format {NEW}; the live "
        f"consumers read up to {PREVIOUS})"
    }
    assert check["older_consumers"] == {QUEUE: {"old-runqueue": PREVIOUS, "older-runqueue": 1}}
    # A consumer that reads them is alive: they are on their way, the probe passes.
    beat(q, "new-runqueue", NEW)
    check = client.get(HEALTH).json()["checks"]["envelope_formats"]
    assert check["ok"]
    assert check["older_consumers"] == {QUEUE: {"old-runqueue": PREVIOUS, "older-runqueue": 1}}
    queue = client.get(HEALTH).json()["queues"][QUEUE]["envelope_formats"]
    assert queue["waiting_for_newer"] == 2 and queue["newest_needed"] == NEW


def test_the_check_w010_names_older_consumers_and_what_waits(q: Queue) -> None:
    assert check_envelope_formats() == []
    beat(q, "runqueue-7", PREVIOUS)
    (warning,) = check_envelope_formats()
    assert warning.id == "delayqueue.W010"
    assert warning.msg == (
        f"Queue 'order-close': 1 live consumer read envelope formats up to {PREVIOUS}, older "
        f"than this release's {NEW}: runqueue-7."
    )
    assert "docs/upgrades.md" in warning.hint
    leave(q, 1)
    (warning,) = check_envelope_formats()
    assert warning.msg.startswith(
        f"Queue 'order-close': 1 message waits for a newer consumer (envelope format {NEW}; "
    )
    with delayqueue(ENVELOPE_FORMAT=PREVIOUS):  # this process is as old as that consumer
        (warning,) = check_envelope_formats()
        assert "older than" not in warning.msg  # what waits is still said


def test_the_check_w010_runs_with_the_deployment_checks() -> None:
    from django.core.checks.registry import registry

    assert check_envelope_formats in registry.get_checks(include_deployment_checks=True)
    assert check_envelope_formats not in registry.get_checks()


def test_queuestats_warns_and_its_json_carries_the_formats(q: Queue) -> None:
    leave(q, 2)
    beat(q, "old-runqueue", PREVIOUS)
    out, err = StringIO(), StringIO()
    call_command("queuestats", QUEUE, stdout=out, stderr=err)
    assert f"warning: queue {QUEUE}: 2 messages wait for a newer consumer" in err.getvalue()
    assert f"warning: queue {QUEUE}: 1 live consumer read envelope formats up to" in (
        err.getvalue()
    )
    out = StringIO()
    call_command("queuestats", QUEUE, "--json", stdout=out)
    (stats,) = json.loads(out.getvalue())["queues"]
    assert stats["envelope_formats"] == {
        "format": NEW,
        "waiting_for_newer": 2,
        "newest_needed": NEW,
        "older_consumers": {"old-runqueue": PREVIOUS},
    }
    (consumer,) = stats["consumers"]
    assert consumer["reads_format"] == PREVIOUS
