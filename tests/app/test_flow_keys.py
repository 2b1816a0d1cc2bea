"""Flow keys as a site uses them: key_concurrency and key_rate_limit as queue settings, refused
by the checks and the admin when they cannot be read, edited in the admin and followed by a
running worker, and shown by the stats (docs/flow-control.md, "Keys").

Waits are polls with generous deadlines on what Redis says, never sleeps that must be long
enough."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import redis
from core_consumer_support import Started
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import override_settings
from test_checks import delayqueue
from test_flow_limits import journal_rows, publish_to_children
from test_runqueue import SLOW, runqueue  # noqa: F401  (a fixture)
from waiting import TIMEOUT, wait_until

import django_delayqueue as dq
from django_delayqueue.checks import check_settings
from django_delayqueue.core import Queue, QueueKeys
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.monitoring.stats import collect
from django_delayqueue.worker import Worker

QUEUE = "keyed"
KEYS = QueueKeys("dq", QUEUE)


@pytest.fixture(autouse=True)
def keyed_queue() -> Iterator[None]:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"key_concurrency": 1, "concurrency": 4}}
    config = {**settings.DELAYQUEUE, "QUEUES": queues, "SETTINGS_REFRESH_SECONDS": 0.1}
    with override_settings(DELAYQUEUE=config):
        queue_overrides.forget()
        yield
    queue_overrides.forget()


def test_e015_key_limits_that_cannot_be_read_are_refused_with_hints() -> None:
    queues = {
        "fine": {"key_concurrency": 1, "key_rate_limit": "1/s burst 3"},
        "zero": {"key_concurrency": 0},
        "text": {"key_concurrency": "one"},
        "no-unit": {"key_rate_limit": "1"},
    }
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        found = check_settings()
    by_queue = {name: [e for e in found if f"[{name!r}]" in e.msg] for name in queues}
    assert by_queue["fine"] == []
    for name in ("zero", "text"):
        (error,) = by_queue[name]
        assert error.id == "delayqueue.E015"
        assert "key_concurrency must be" in error.msg and "one at a time per key" in error.hint
    (error,) = by_queue["no-unit"]
    assert "key_rate_limit must be" in error.msg and "one flow key" in error.hint


@pytest.mark.django_db
def test_the_admin_refuses_a_key_limit_that_cannot_be_read(redis_client: redis.Redis) -> None:
    from django_delayqueue.models import QueueConfig

    row = QueueConfig(name=QUEUE, key_rate_limit="once a second")
    with pytest.raises(ValidationError, match="key_rate_limit must be"):
        row.full_clean()
    row.key_rate_limit, row.key_concurrency = "1/s", 0
    with pytest.raises(ValidationError, match="key_concurrency must be"):
        row.full_clean()
    row.key_concurrency = 1
    row.full_clean()


@pytest.mark.django_db(transaction=True)
def test_key_concurrency_edited_in_the_admin_reaches_a_running_worker(
    redis_client: redis.Redis, running: Started
) -> None:
    from django_delayqueue.models import QueueConfig

    started: list[tuple[str | None, int]] = []
    release = threading.Event()

    def handler(message: dq.Message, **kwargs: Any) -> None:
        started.append((message.key, message.payload["n"]))
        release.wait(30)

    dq.topic(QUEUE).connect(handler, weak=False)
    try:
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1, maintenance_seconds=0.1)
        running(worker)
        for n in range(3):
            dq.schedule(QUEUE, {"n": n}, key="+33612345678", on_commit=False)
        wait_until(lambda: started and redis_client.hget(KEYS.limiter, "held") == b"key")
        assert started == [("+33612345678", 0)]  # the second waits for the key's slot
        assert redis_client.zcard(KEYS.unack) == 1
        (stats,) = collect([QUEUE])
        assert (stats.flow.held, stats.flow.waiting) == ("key", 2)
        assert stats.oldest_overdue_ms is None  # waiting on purpose, not late
        row = QueueConfig.objects.get(name=QUEUE)
        row.key_concurrency = 3
        row.full_clean()
        row.save()  # published on commit; the worker follows at its next settings refresh
        wait_until(lambda: len(started) == 3)
        assert [n for _, n in started] == [0, 1, 2]
    finally:
        release.set()
        dq.topic(QUEUE).disconnect(handler)


@pytest.mark.slow
def test_key_concurrency_holds_across_runqueue_processes(
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
    runqueue: Any,  # noqa: F811
) -> None:
    publish_to_children(redis_client, SLOW, key_concurrency=1)
    queue = Queue(redis_client, "demo-slow", prefix="dq")
    key_of = {}
    for n in range(3):
        for k in range(3):
            message_id = queue.schedule({"seconds": 0.2}, id=f"k{k}-{n}", key=f"k{k}").id
            key_of[message_id] = f"k{k}"
    for _ in "ab":
        runqueue(redis_server.url, "demo-slow", "--concurrency", "4")
    wait_until(lambda: len(journal_rows(redis_client, SLOW)) == 9, TIMEOUT * 2)
    rows = journal_rows(redis_client, SLOW)
    # Eight threads could run all nine at once; per key, the deliveries run one after the
    # other (a key's slot is claimed again only after the ack that freed it), in their order.
    for key in ("k0", "k1", "k2"):
        runs = sorted((r[3], r[4], r[0]) for r in rows if key_of[r[0]] == key)
        assert [run[2] for run in runs] == [f"{key}-{n}" for n in range(3)]
        for (_, finished, _), (started, _, _) in pairwise(runs):
            assert started >= finished - 2  # the processes' clocks may differ by 1-2 ms


@pytest.mark.slow
def test_a_key_slot_of_a_killed_runqueue_comes_back_with_the_visibility_timeout(
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
    runqueue: Any,  # noqa: F811
) -> None:
    publish_to_children(redis_client, SLOW, key_concurrency=1, visibility_timeout=2)
    queue = Queue(redis_client, "demo-slow", prefix="dq")
    queue.schedule({"seconds": 60}, id="hang", key="+33612345678")
    queue.schedule({"seconds": 0}, id="quick", key="+33612345678")
    first = runqueue(redis_server.url, "demo-slow", "--concurrency", "4")
    first.wait_until(lambda: redis_client.llen("demo:slow:started") == 1, "the first hangs")
    assert redis_client.zcard(SLOW.unack) == 1  # the key's slot: the quick one waits
    first.proc.kill()  # kill -9: its slot stays taken until the visibility timeout
    first.proc.wait()
    second = runqueue(redis_server.url, "demo-slow", "--concurrency", "4")
    second.wait_until(
        lambda: b"quick" in redis_client.lrange("demo:slow:done", 0, -1),
        "the quick one runs in the slot the killed process held",
    )
