"""A ``@periodic`` task for tests/app/test_recurring_tasks.py (imported there only: registering it
anywhere else would give every other test's worker its ticks)."""

from __future__ import annotations

import os

import redis

from django_delayqueue.tasks.periodic import periodic

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

TRACE = "test:periodic:trace"


@periodic(every=1, catch_up="all", kwargs={"kind": "beat"})
@task(queue_name="shop-tasks")
def beat(kind: str) -> str:
    redis.Redis.from_url(os.environ["REDIS_URL"]).rpush(TRACE, kind)
    return f"{kind} done"
