"""Tasks the Tasks-backend tests enqueue (module level, as the framework requires).

They run on the demo's task queue ("shop-tasks", settings.TASKS) and leave traces in Redis
(``TRACE``), which both an in-process worker and a ``runqueue`` subprocess can write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import redis

import django_delayqueue as dq
from django_delayqueue.tasks.backend import DelayQueueBackend

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

TRACE = "test:tasks:trace"


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"])


@task(queue_name="shop-tasks")
def add(a: int, b: int) -> int:
    _redis().rpush(TRACE, f"add {a} {b}")
    return a + b


@task(queue_name="shop-tasks")
def returns_structure(name: str, *, tags: list[str]) -> dict[str, Any]:
    return {"name": name, "tags": tags, "nested": [1, 2.5, None, True]}


@task(queue_name="shop-tasks", takes_context=True)
def knows_its_context(context: Any, label: str) -> dict[str, Any]:
    result = context.task_result
    return {
        "label": label,
        "id": result.id,
        "attempt": context.attempt,
        "errors": len(result.errors),
        "status": str(result.status),
    }


@task(queue_name="shop-tasks", takes_context=True)
def fails_twice(context: Any) -> int:
    if context.attempt < 3:
        raise ValueError(f"attempt {context.attempt} fails")
    return context.attempt


@task(queue_name="shop-tasks")
def always_fails(what: str) -> None:
    raise RuntimeError(f"broken: {what}")


@task(queue_name="shop-tasks")
def exits() -> None:
    raise SystemExit(3)  # a BaseException: still just a failed attempt


@task(queue_name="shop-tasks")
def asks_for_retry(seconds: float) -> None:
    raise dq.Retry(delay=seconds, reason="not yet")


@task(queue_name="shop-tasks")
def rejects() -> None:
    raise dq.Reject("this order no longer exists")


@task(queue_name="shop-tasks")
def returns_a_set() -> Any:
    return {1, 2}  # not JSON: a failure, as in Django's own backends


@task(queue_name="shop-tasks")
def returns_nested(levels: int) -> Any:
    """A value nested ``levels`` lists deep; counts its runs in ``TRACE``."""
    _redis().rpush(TRACE, f"returns_nested {levels}")
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


@task(queue_name="shop-tasks")
def returns_a_file_name() -> str:
    return os.fsdecode(b"r\xffport.pdf")  # not UTF-8: a lone surrogate, "r\udcffport.pdf"


@task(queue_name="shop-tasks")
async def sleeps_async(label: str) -> str:
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    _redis().rpush(TRACE, f"async {label} {type(loop).__name__}")
    return f"async {label}"


@task(queue_name="shop-tasks", takes_context=True)
def reads_its_own_result(context: Any) -> str:
    """What ``get_result`` says of this task while it runs (read from Redis, not the context)."""
    mine = context.task_result
    return str(mine.task.get_result(mine.id).status)


@task(queue_name="shop-tasks")
def waits_for_release(key: str) -> str:
    """Runs until the test pushes to ``key`` (at most a minute)."""
    client = _redis()
    for _ in range(60):  # short waits: redis-py 8 times a read out after 5 s by default
        if client.blpop([key], timeout=1):
            break
    return "released"


class SubclassedBackend(DelayQueueBackend):
    """DelayQueueBackend under another import path, as a project's own subclass would be."""


def _spin_swallowing_every_exception() -> None:
    """Pure Python that never returns and swallows every Exception: only a stop ends it."""
    while True:
        try:
            while True:
                pass
        except Exception:
            pass


def _work_until_aborted(aborted: Callable[[], bool] = dq.abort_requested) -> None:
    """Say "working" in ``TRACE``, then wait in short sleeps until ``aborted()``."""
    _redis().rpush(TRACE, "working")
    while not aborted():
        time.sleep(0.01)


async def _work_until_aborted_async() -> None:
    """:func:`_work_until_aborted` awaiting (its abort read from a context variable)."""
    _redis().rpush(TRACE, "working")
    while not dq.abort_requested():
        await asyncio.sleep(0.01)


@task(queue_name="shop-tasks")
def spins_until_stopped() -> None:
    """Pure Python that swallows every Exception: only a time limit ends it."""
    _spin_swallowing_every_exception()


@task(queue_name="shop-tasks")
async def async_works_until_aborted() -> str:
    """works_until_aborted as an async def task (its abort read from a context variable)."""
    await _work_until_aborted_async()
    return "stopped cleanly"


@task(queue_name="shop-tasks")
def works_until_aborted() -> str:
    """A long task that stops cleanly once its message is aborted (dq.abort)."""
    _work_until_aborted()
    return "stopped cleanly"


@task(queue_name="shop-tasks")
def ignores_its_abort() -> None:
    """Sees its abort and goes on (pure Python, every Exception swallowed): only a stop ends it."""
    _work_until_aborted()
    _redis().rpush(TRACE, "saw the abort")
    _spin_swallowing_every_exception()


@task(queue_name="shop-tasks")
async def async_ignores_its_abort() -> None:
    """ignores_its_abort as an async def task: awaits on once aborted, till it is cancelled."""
    await _work_until_aborted_async()
    _redis().rpush(TRACE, "saw the abort")
    while True:
        with contextlib.suppress(Exception):
            await asyncio.sleep(3600)


async def _abort_requested() -> bool:
    return dq.abort_requested()


@task(queue_name="shop-tasks")
def works_until_aborted_seen_through_asgiref() -> str:
    """works_until_aborted, its abort read inside asgiref's async_to_sync (another thread, the
    task's context copied), as Django's async signal receivers of a sync send are."""
    from asgiref.sync import async_to_sync

    _work_until_aborted(async_to_sync(_abort_requested))
    _redis().rpush(TRACE, "saw the abort")
    return "stopped cleanly"


@task(queue_name="shop-tasks")
def empties_its_arguments(items: list[int], *, options: dict[str, int]) -> int:
    """Changes its arguments in place as it runs (what a record's "enqueued" must not see)."""
    total = sum(items) + sum(options.values())
    items.clear()
    options.clear()
    return total


# A test pushes here to let a task that reported its progress finish (a list: BLPOP waits on it
# from a runqueue subprocess as well as from an in-process worker).
PROGRESS_GATE = "test:tasks:progress-gate"


@task(queue_name="shop-tasks", takes_context=True)
def reports_progress(context: Any, steps: int) -> int:
    """Reports its progress in a tight loop, ends at 50%, then waits for the test."""
    from django_delayqueue.tasks import progress

    for step in range(steps):
        assert progress(100 * step / steps, f"step {step} of {steps}")
    assert progress(50, f"halfway, attempt {context.attempt}")
    _redis().rpush(TRACE, "reported")
    _redis().blpop([PROGRESS_GATE], timeout=60)
    return steps


@task(queue_name="shop-tasks")
async def async_reports_progress() -> str:
    """reports_progress as an async def task (dq.progress finds it through its context)."""
    assert dq.progress(25.5, "async quarter")
    _redis().rpush(TRACE, "reported")
    while not _redis().exists(PROGRESS_GATE):
        await asyncio.sleep(0.01)
    return "done"


@task(queue_name="shop-tasks", takes_context=True)
def writes_a_group(context: Any, name: str) -> str:
    """On an atomic queue (tests/app/test_inbox.py): its write is rolled back with its first
    attempt's failure, and committed with the second."""
    from django.contrib.auth.models import Group

    Group.objects.create(name=f"{name}-{context.attempt}")
    if context.attempt == 1:
        raise ValueError("the first attempt fails after its write")
    return name
