"""What needs attention, in words (monitoring.attention), on the admin's overview and queue page:
consumers missing or dying at start, stalled handlers, a queue behind or late, dead letters
growing, a limit holding, a pause; and a calm line when nothing does."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from admin_support import OVERVIEW, QUEUE, bury, page
from django.conf import settings
from django.test import override_settings
from lateness_support import LATE_QUEUE, LATE_QUEUE_SETTINGS, deliver_late

from django_delayqueue.core import Queue
from django_delayqueue.core.timings.counts import TimingCounts
from django_delayqueue.core.timings.reading import TimingWindows
from django_delayqueue.monitoring.attention import findings
from django_delayqueue.monitoring.flow import FlowStats
from django_delayqueue.monitoring.lateness import LatenessStats
from django_delayqueue.monitoring.processes import ConsumerProcess, RunningNow
from django_delayqueue.monitoring.stats import QueueStats

pytestmark = pytest.mark.django_db

NOW = 1_700_000_000_000
QUIET = dict.fromkeys(("pending", "ready", "unack", "retry", "garbage"), 0)


def stats(**fields: Any) -> QueueStats:
    """A queue that is well: a live consumer, nothing waiting, nothing dead."""
    return QueueStats(
        **{"queue": "q", "now_ms": NOW, "counts": dict(QUIET), "consumers_alive": 1, **fields}
    )


def said(s: QueueStats, time_limit: float | None = None) -> dict[str, tuple[str, str]]:
    return {f.kind: (f.severity, f.text) for f in findings(s, time_limit)}


def test_a_well_queue_needs_nothing() -> None:
    assert findings(stats()) == []


def test_no_consumer_is_an_error_when_messages_wait_and_nothing_when_paused() -> None:
    waiting = stats(consumers_alive=0, counts={**QUIET, "pending": 3})
    severity, text = said(waiting)["no-consumer"]
    assert severity == "error" and "nothing delivers its 3 waiting messages" in text
    assert said(stats(consumers_alive=0))["no-consumer"][0] == "warning"
    paused = said(stats(consumers_alive=0, paused=True))
    assert "no-consumer" not in paused and paused["paused"][0] == "info"


def test_handlers_past_the_time_limit_are_stalled() -> None:
    running = [RunningNow("m1", "q", "c1", 1, NOW - 40_000), RunningNow("m2", "q", "c1", 1, NOW)]
    s = stats(processes=[ConsumerProcess("c1", NOW, running_count=2, running=running)])
    severity, text = said(s, time_limit=30)["stalled"]
    assert severity == "error" and "1 handler running past its time limit (30 s)" in text
    assert "stalled" not in said(s, time_limit=None)  # no limit, nothing stalls


def test_behind_late_and_dying_at_start() -> None:
    behind = said(stats(oldest_overdue_ms=90_000))["overdue"]
    assert behind == ("warning", "is behind: its oldest due message has waited 1 min 30 s.")
    counted = said(stats(oldest_overdue_ms=90_000, overdue_messages=14))["overdue"][1]
    assert (
        counted
        == "is behind: its oldest due message has waited 1 min 30 s (14 due messages not started)."
    )
    assert "overdue" not in said(stats(oldest_overdue_ms=2_000))  # a moment is not behind
    minute = TimingCounts()
    minute.histograms["lateness"][8] = 10  # (50, 100] ms
    late = LatenessStats(TimingWindows(last_5m=minute, last_hour=minute), warning_ms=20)
    severity, text = said(stats(lateness=late))["late"]
    assert severity == "warning" and "above its lateness_warning_ms (20 ms)" in text
    dying = said(stats(start_failures=["consumers keep dying at start: ImportError"]))
    assert dying["dying"][0] == "error"


def test_dead_letters_growing_or_kept_and_a_limit_holding() -> None:
    minute = TimingCounts()
    minute.outcomes["dead"] = 2
    growing = stats(
        counts={**QUIET, "garbage": 5}, lateness=LatenessStats(TimingWindows(last_5m=minute))
    )
    assert said(growing)["dead-letters"] == (
        "warning",
        "has new dead letters: 2 in the last 5 minutes, 5 in all.",
    )
    kept = said(stats(counts={**QUIET, "garbage": 1}))["dead-letters"]
    assert kept == ("info", "keeps 1 dead letter: requeue or purge them.")
    held = stats(flow=FlowStats(rate_limit="5/s", held="rate", waiting=8))
    assert said(held)["held"] == (
        "info",
        "is held back by its rate limit, as configured (8 ready messages waiting).",
    )


def test_the_most_severe_come_first() -> None:
    s = stats(consumers_alive=0, paused=False, counts={**QUIET, "garbage": 1, "ready": 1})
    assert [f.severity for f in findings(s)] == ["error", "info"]


# --- on the pages ------------------------------------------------------------------------------


def test_the_overview_says_what_needs_attention_and_links_to_it(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    q = Queue(redis_client, QUEUE, prefix="dq")
    q.schedule({"order_id": 1})  # due now, and no consumer alive
    bury(q, "dead-1", reason="card declined")
    html = admin_client.get(OVERVIEW).content.decode()
    box = html.split('id="dq-attention"', 1)[1].split("</div>", 1)[0]
    assert 'data-severity="error" data-kind="no-consumer"' in box
    assert "has no live consumer: nothing delivers its 1 waiting message" in box
    assert f'href="{page(QUEUE, "garbage")}"' in box and "keeps 1 dead letter" in box
    assert f'<tr data-queue="{QUEUE}" data-attention="error">' in html  # its row is marked
    assert "Nothing needs attention" not in html


def test_the_overview_is_calm_when_nothing_needs_attention(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    for name in settings.DELAYQUEUE["QUEUES"]:
        q = Queue(redis_client, name, prefix="dq")
        redis_client.zadd(q.keys.heartbeats, {"worker-a": q.clock.now_ms()})
    html = admin_client.get(OVERVIEW).content.decode()
    assert "Nothing needs attention" in html and 'class="dq-attention"' not in html


def test_the_queue_page_says_what_needs_attention_in_its_queue(
    admin_client: Any, redis_client: redis.Redis
) -> None:
    queues = {**settings.DELAYQUEUE["QUEUES"], LATE_QUEUE: {**LATE_QUEUE_SETTINGS}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        deliver_late(redis_client, ["reject", "ok"], late_ms=3)  # one dies now
        html = admin_client.get(page(LATE_QUEUE)).content.decode()
    box = html.split('id="dq-attention"', 1)[1].split("</div>", 1)[0]
    assert "has new dead letters: 1 in the last 5 minutes, 1 in all." in box
    assert 'data-kind="no-consumer"' in box  # the burst worker has stopped
