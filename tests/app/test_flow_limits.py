"""Flow limits as a site uses them: queue settings edited in the admin and followed by a
running worker, and held across real ``runqueue`` processes (docs/flow-control.md).

Waits are polls with generous deadlines, never sleeps that must be long enough. The rate is
checked on the journal's start times with the slack of a claim lead and a handler thread's
start (see tests/core/test_core_consumer_flow.py for the exact check on claim instants).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from core_consumer_support import Started
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import override_settings
from test_runqueue import SLOW, runqueue, schedule_slow  # noqa: F401  (a fixture)
from waiting import TIMEOUT, wait_until

import django_delayqueue as dq
from django_delayqueue.core import Queue, QueueKeys
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.worker import Worker

QUEUE = "flow"
KEYS = QueueKeys("dq", QUEUE)


@pytest.fixture(autouse=True)
def flow_queue() -> Iterator[None]:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"rate_limit": "1/h", "concurrency": 2}}
    config = {**settings.DELAYQUEUE, "QUEUES": queues, "SETTINGS_REFRESH_SECONDS": 0.1}
    with override_settings(DELAYQUEUE=config):
        queue_overrides.forget()
        yield
    queue_overrides.forget()


def journal_rows(client: redis.Redis, keys: QueueKeys) -> list[list[Any]]:
    """[id, scheduled, due, started, finished, attempt, status, error] of every delivery."""
    rows: list[list[Any]] = []
    for _, fields in client.xrange(keys.journal):
        rows += json.loads(fields[b"o"])
    return rows


def most_in_any_window(instants: list[int], window_ms: float) -> int:
    instants = sorted(instants)
    return max(
        sum(1 for t in instants[i:] if t < start + window_ms) for i, start in enumerate(instants)
    )


@pytest.mark.django_db(transaction=True)
def test_a_rate_edited_in_the_admin_reaches_a_running_worker(
    redis_client: redis.Redis, running: Started
) -> None:
    from django_delayqueue.models import QueueConfig

    seen: list[str] = []

    def record(message: dq.Message, **kwargs: Any) -> None:
        seen.append(message.id)

    dq.topic(QUEUE).connect(record, weak=False)
    try:
        worker = Worker.for_queues([QUEUE], idle_seconds=0.1, maintenance_seconds=0.1)
        running(worker)
        for i in range(6):
            dq.schedule(QUEUE, {"n": i}, id=f"f{i}")
        wait_until(lambda: len(seen) == 1)  # one token, the next in an hour
        assert worker.queues[0].settings.rate_limit == "1/h"
        assert redis_client.hget(KEYS.limiter, "held") == b"rate"
        row = QueueConfig.objects.get(name=QUEUE)
        row.rate_limit, row.max_in_flight = "50/s burst 5", 3
        row.full_clean()
        row.save()  # published on commit; the worker follows at its next settings refresh
        wait_until(lambda: len(seen) == 6)
        assert worker.queues[0].settings.rate_limit == "50/s burst 5"
        assert worker.queues[0].settings.max_in_flight == 3
    finally:
        dq.topic(QUEUE).disconnect(record)


@pytest.mark.django_db
def test_the_admin_refuses_a_limit_that_cannot_be_read(redis_client: redis.Redis) -> None:
    from django_delayqueue.models import QueueConfig

    row = QueueConfig(name=QUEUE, rate_limit="20 a second")
    with pytest.raises(ValidationError, match="rate_limit must be"):
        row.full_clean()
    row.rate_limit, row.max_in_flight = None, 0
    with pytest.raises(ValidationError, match="max_in_flight must be"):
        row.full_clean()


@pytest.mark.django_db
def test_the_admin_refuses_limits_a_sharded_queue_cannot_split(redis_client: redis.Redis) -> None:
    """What E015 refuses, the admin form does too: the shard count is the settings file's."""
    from django_delayqueue.models import QueueConfig

    queues = {**settings.DELAYQUEUE["QUEUES"], "flowsharded": {"shards": 4}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        row = QueueConfig(name="flowsharded", max_in_flight=2)
        with pytest.raises(ValidationError, match="at least the number of shards"):
            row.full_clean()
        row.max_in_flight, row.rate_limit = None, "10/s burst 2"
        with pytest.raises(ValidationError, match="burst"):
            row.full_clean()
        row.rate_limit, row.max_in_flight = "10/s burst 4", 4
        row.full_clean()  # a share of each for every shard
        QueueConfig(name=QUEUE, max_in_flight=2, rate_limit="10/s burst 2").full_clean()


def publish_to_children(client: redis.Redis, keys: QueueKeys, **values: Any) -> None:
    """What the admin publishes for a queue (its config hash), before the processes start."""
    mapping = {name: json.dumps(value) for name, value in values.items()}
    client.hset(keys.config, mapping={**mapping, "version": 1, "updated_ms": 0})


@pytest.mark.slow
def test_two_runqueue_processes_share_one_rate(
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
    runqueue: Any,  # noqa: F811
) -> None:
    publish_to_children(redis_client, SLOW, rate_limit="20/s")  # one start every 50 ms
    ids = schedule_slow(redis_client, 30, seconds=0)
    children = [runqueue(redis_server.url, "demo-slow", "--concurrency", "4") for _ in "ab"]
    children[0].wait_until(lambda: redis_client.llen("demo:slow:done") == 30, "all 30 done")
    assert sorted(v.decode() for v in redis_client.lrange("demo:slow:done", 0, -1)) == sorted(ids)
    wait_until(lambda: len(journal_rows(redis_client, SLOW)) == 30)
    starts = [row[3] for row in journal_rows(redis_client, SLOW)]
    # Eight threads in two processes would start all 30 within a few milliseconds; the limit
    # spaces them 50 ms apart. Slack: a claim lead (5 ms) and one late handler thread start.
    assert most_in_any_window(starts, 1000) <= 1 + 20 + 1
    assert max(starts) - min(starts) >= 29 * 50 - 100
    assert int(redis_client.hget(SLOW.limiter, "throttled") or 0) >= 25


@pytest.mark.slow
def test_max_in_flight_holds_across_runqueue_processes(
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
    runqueue: Any,  # noqa: F811
) -> None:
    publish_to_children(redis_client, SLOW, max_in_flight=2)
    schedule_slow(redis_client, 8, seconds=0.2)
    for _ in "ab":
        runqueue(redis_server.url, "demo-slow", "--concurrency", "4")
    wait_until(lambda: len(journal_rows(redis_client, SLOW)) == 8, TIMEOUT * 2)
    rows = journal_rows(redis_client, SLOW)
    # Each delivery's run, started -> finished: never three at once. A slot is claimed again
    # only after the ack that freed it, which follows its handler's end; the processes' clocks
    # (readings of the server's) may differ by a millisecond or two.
    for started in (row[3] for row in rows):
        running = [r for r in rows if r[3] <= started + 2 and r[4] > started + 2]
        assert len(running) <= 2


@pytest.mark.slow
def test_slots_of_a_killed_runqueue_come_back_with_the_visibility_timeout(
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
    runqueue: Any,  # noqa: F811
) -> None:
    publish_to_children(redis_client, SLOW, max_in_flight=2, visibility_timeout=2)
    queue = Queue(redis_client, "demo-slow", prefix="dq")
    queue.schedule_many([{"payload": {"seconds": 60}, "id": f"hang-{i}"} for i in range(2)])
    queue.schedule_many([{"payload": {"seconds": 0}, "id": f"quick-{i}"} for i in range(2)])
    first = runqueue(redis_server.url, "demo-slow", "--concurrency", "4")
    first.wait_until(lambda: redis_client.llen("demo:slow:started") == 2, "two handlers hang")
    assert redis_client.zcard(SLOW.unack) == 2  # the cap: the quick ones wait
    first.proc.kill()  # kill -9: its two slots stay taken until their visibility timeout
    first.proc.wait()
    second = runqueue(redis_server.url, "demo-slow", "--concurrency", "4")
    second.wait_until(
        lambda: {b"quick-0", b"quick-1"} <= set(redis_client.lrange("demo:slow:done", 0, -1)),
        "the quick ones run in the slots the killed process held",
    )
    assert redis_client.zcard(SLOW.unack) <= 2
