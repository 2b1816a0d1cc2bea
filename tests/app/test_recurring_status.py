"""django_delayqueue.monitoring.recurrences (and the definitions it reads): what queuestats, the
metrics and the admin show of each schedule, whatever a row or the published set holds."""

from __future__ import annotations

import io
import json
import logging
from importlib.util import find_spec
from typing import Any

import pytest
import redis
from django.core.management import call_command
from test_recurring import QUEUE, configure

from django_delayqueue.core import ConfigurationError
from django_delayqueue.mirror.kinds import recurrences_mirror
from django_delayqueue.mirror.recurrences import load_published, publish, published_key
from django_delayqueue.models import RecurringSchedule

# What an older release let through: an interval whose ticks no date can name.
HUGE = {"queue": QUEUE, "every": 4e11, "timezone": "UTC", "payload": None}


def _queuestats(*args: str) -> str:
    out = io.StringIO()
    call_command("queuestats", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_a_row_past_validation_is_listed_with_its_error_and_never_published(
    redis_client: redis.Redis, client: Any
) -> None:
    with configure({}):
        huge = RecurringSchedule.objects.create(name="huge", queue=QUEUE, every=60)
        RecurringSchedule.objects.filter(pk=huge.pk).update(every=4e11)  # skips clean()
        RecurringSchedule.objects.create(name="fine", queue=QUEUE, every=60)
        table = _queuestats(QUEUE)  # from the rows: nothing published yet
        recurrences_mirror.publish_from_db()
        published = load_published()
        document = json.loads(_queuestats(QUEUE, "--json"))  # from the published set
    (line,) = [x for x in table.splitlines() if x.startswith("huge")]
    assert "error: invalid: schedule 'huge'" in line
    assert published is not None and [r.name for r in published.recurrences] == ["fine"]
    assert [s["name"] for s in document["schedules"]] == ["fine"]


@pytest.mark.django_db
def test_a_definition_an_older_release_published_is_shown_as_an_error_and_logged_once(
    redis_client: redis.Redis, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    definitions = {"huge": HUGE, "fine": {"queue": QUEUE, "every": 60}}
    with configure({}), caplog.at_level(logging.ERROR, "django_delayqueue.mirror"):
        with pytest.raises(ConfigurationError, match="schedule 'huge': 'every' must be"):
            publish(definitions)  # refused now, so written as an older release did:
        redis_client.hset(
            published_key(), mapping={"definitions": json.dumps(definitions), "version": 1}
        )
        # Every runqueue loads the published set each SETTINGS_REFRESH_SECONDS.
        loads = [load_published() for _ in range(3)]
        document = json.loads(_queuestats("--json"))
        metrics = client.get("/delayqueue/metrics/")
    assert all(p is not None and p.unreadable == ["huge"] for p in loads)
    fine, huge = document["schedules"]  # by name
    assert huge["name"] == "huge" and huge["queue"] == QUEUE and huge["next_run_ms"] is None
    assert "'every' must be a number of seconds, at least 1 and at most" in huge["error"]
    assert fine["name"] == "fine" and not fine["error"] and fine["next_run_ms"] > 0
    # 501 without the metrics extra (prometheus-client); the main run has it.
    assert metrics.status_code == (200 if find_spec("prometheus_client") else 501)
    logged = [r for r in caplog.records if "schedule 'huge'" in r.getMessage()]
    assert len(logged) == 1
