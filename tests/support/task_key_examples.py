"""Tasks the flow-key tests enqueue (module level, as the framework requires), on the demo's task
queue ("shop-tasks"). Each records its arguments in Redis (``TRACE``) when it runs."""

from __future__ import annotations

import os
from typing import Any

import redis

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

TRACE = "test:tasks:keys"


def _trace(text: str) -> None:
    redis.Redis.from_url(os.environ["REDIS_URL"]).rpush(TRACE, text)


@task(queue_name="shop-tasks")
def sync_store(store_id: Any, full: bool = False) -> None:
    _trace(f"sync {store_id}")


@task(queue_name="shop-tasks", takes_context=True)
def send_sms(context: Any, phone: str, text: str = "") -> None:
    _trace(f"sms {phone}")


@task(queue_name="shop-tasks")
def regional_report(region: str = "eu") -> None:
    _trace(f"report {region}")


@task(queue_name="shop-tasks")
def unkeyed(n: int) -> None:
    _trace(f"unkeyed {n}")
