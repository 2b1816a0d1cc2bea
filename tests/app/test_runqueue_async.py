"""``runqueue`` as a real process with ``async def`` handlers (the demo's "demo-slow-async"
queue): SIGTERM lets the running coroutines finish within --grace, then cancels the rest and
leaves their messages in flight."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import redis
from test_runqueue import runqueue  # noqa: F401 (the fixture)

from django_delayqueue.core import Queue, QueueKeys
from django_delayqueue.embedded import RedisServerProcess

KEYS = QueueKeys("dq", "demo-slow-async")
STARTED, DONE = "demo:slow:started:async", "demo:slow:done:async"
CANCELLED = "demo:slow:done:async:cancelled"


def ids_in(client: redis.Redis, key: str) -> set[str]:
    return {v.decode() for v in client.lrange(key, 0, -1)}


@pytest.mark.slow
def test_sigterm_with_coroutines_running(
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
    runqueue: Any,  # noqa: F811
) -> None:
    queue = Queue(redis_client, "demo-slow-async", prefix="dq")
    quick = {queue.schedule({"seconds": 0.5}, id=f"quick-{i}").id for i in range(3)}
    slow = {queue.schedule({"seconds": 3600}, id=f"slow-{i}").id for i in range(3)}
    child = runqueue(redis_server.url, "demo-slow-async", "--grace", "10")
    child.wait_until(lambda: len(ids_in(redis_client, STARTED)) == 6, "every handler started")
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0, child.output()
    # The quick ones finished within the grace period and were acknowledged; the slow ones
    # were cancelled at its end and stay in flight: back after their visibility timeout,
    # never beside their handler, nothing lost.
    assert ids_in(redis_client, DONE) == quick
    assert ids_in(redis_client, CANCELLED) == slow
    assert {v.decode() for v in redis_client.zrange(KEYS.unack, 0, -1)} == slow
    assert redis_client.hlen(KEYS.messages) == len(slow)
    assert not redis_client.zcard(KEYS.garbage) and not redis_client.zcard(KEYS.retry)
