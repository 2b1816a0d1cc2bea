"""``async def`` tasks the async-handler tests enqueue (module level, as the framework requires),
on the demo's task queue ("shop-tasks")."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import django_delayqueue as dq

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

# Filled by the tasks as they run (in the test's own process: the worker runs in-process).
SEEN: dict[str, Any] = {"threads": set(), "running": 0, "most": 0}
GATE: dict[str, Any] = {}  # "event": an asyncio.Event of the worker's loop, "size": how many


@task(queue_name="shop-tasks")
async def crowd(n: int) -> int:
    """Returns once GATE["size"] of these wait at once."""
    SEEN["threads"].add(threading.get_ident())
    SEEN["running"] += 1
    SEEN["most"] = max(SEEN["most"], SEEN["running"])
    if "event" not in GATE:
        GATE["event"] = asyncio.Event()
    if SEEN["running"] >= GATE["size"]:
        GATE["event"].set()
    await asyncio.wait_for(GATE["event"].wait(), 20)
    return n * 2


@task(queue_name="shop-tasks")
async def fails_async(what: str) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(f"broken: {what}")


@task(queue_name="shop-tasks")
async def retries_async() -> None:
    raise dq.Retry(delay=3600, reason="later")


@task(queue_name="shop-tasks")
async def hangs_async() -> None:
    await asyncio.sleep(3600)


@task(queue_name="shop-tasks", takes_context=True)
async def knows_its_attempt(context: Any) -> int:
    await asyncio.sleep(0)
    return int(context.attempt)
