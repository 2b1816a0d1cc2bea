"""Shared fixtures. Redis: one private redis-server per test session, flushed around each test.

The server starts in ``pytest_configure`` rather than lazily in its fixture so that every
test, Django settings included, sees one URL. pytest-django imports tests/settings.py
before any conftest is loaded, so exporting ``REDIS_URL`` here is too late for settings.py to
read it: we export it (for child processes such as ``runqueue``, which load settings afresh)
and also override the loaded settings, which sends ``setting_changed`` to cached readers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

# Helpers (tests/support) are imported by their bare names from every folder of the suite, and
# by the child processes the tests start (support/paths.py gives those the same path).
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from core_consumer_support import Started

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.embedded import RedisServerProcess

_SERVER = pytest.StashKey[RedisServerProcess]()
_UNDO = pytest.StashKey[list[Callable[[], object]]]()  # run at unconfigure, last first


def pytest_configure(config: pytest.Config) -> None:
    server = RedisServerProcess().start()
    config.stash[_SERVER] = server
    undo: list[Callable[[], object]] = [server.stop]
    config.stash[_UNDO] = undo

    previous = os.environ.get("REDIS_URL")
    os.environ["REDIS_URL"] = server.url
    undo.append(lambda: _restore_env("REDIS_URL", previous))
    # Spark's class archive (a speed-up) would be written to the user's cache by whichever
    # child command starts first; the suite runs without it and tests it on its own.
    archive = os.environ.get("DELAYQUEUE_SPARK_CLASS_ARCHIVE")
    os.environ["DELAYQUEUE_SPARK_CLASS_ARCHIVE"] = "0"
    undo.append(lambda: _restore_env("DELAYQUEUE_SPARK_CLASS_ARCHIVE", archive))
    # Every JVM the suite starts (the local SparkSession, the drivers of child commands, the
    # standalone cluster's master, worker and executors) lives seconds to minutes: compiling
    # hot code a second time with C2 costs more CPU than it wins back. C1 alone, through the
    # variable every JVM reads (children inherit it), took a small Spark job from ~10 s to
    # ~7.3 s here. What the tests check does not depend on the JIT; a developer's own
    # JAVA_TOOL_OPTIONS is kept as it is.
    java_options = os.environ.get("JAVA_TOOL_OPTIONS")
    if java_options is None:
        os.environ["JAVA_TOOL_OPTIONS"] = "-XX:TieredStopAtLevel=1"
        undo.append(lambda: _restore_env("JAVA_TOOL_OPTIONS", None))

    from django.conf import settings

    if settings.configured:  # not under `-p no:django`
        from django.test.utils import override_settings

        delayqueue = {**getattr(settings, "DELAYQUEUE", {}), "REDIS_URL": server.url}
        override = override_settings(REDIS_URL=server.url, DELAYQUEUE=delayqueue)
        override.enable()
        undo.append(override.disable)


LAYERS = ("core", "app", "drills", "spark", "docs")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test carries the marker of its folder: ``-m core``, ``-m "not drills"``."""
    tests = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.path)).resolve()
        folder = path.relative_to(tests).parts[0] if path.is_relative_to(tests) else None
        if folder in LAYERS:
            item.add_marker(getattr(pytest.mark, folder))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Escape what a test's captured output holds that UTF-8 cannot encode.

    Some tests log a lone surrogate on purpose (a file name ``os.fsdecode`` could not decode);
    pytest-xdist cannot send such text from a worker, and its whole run would fail.
    """
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]


def pytest_unconfigure(config: pytest.Config) -> None:
    for step in reversed(config.stash.get(_UNDO, [])):
        step()


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@pytest.fixture(scope="session")
def redis_server(pytestconfig: pytest.Config) -> RedisServerProcess:
    """The session's private redis-server; ``REDIS_URL`` and settings already point at it.

    Tests that kill or restart a server should start their own ``RedisServerProcess``.
    """
    return pytestconfig.stash[_SERVER]


@pytest.fixture
def redis_client(redis_server: RedisServerProcess) -> Iterator[redis.Redis]:
    """A bytes client on the private server, FLUSHALLed before and after the test.

    ``flushall`` refuses any server whose port and PID are not the fixture's, so a
    misconfigured run can never wipe a shared Redis such as the one on 6379.
    """
    client = redis.Redis.from_url(redis_server.url, decode_responses=False)
    redis_server.flushall(client)
    try:
        yield client
    finally:
        redis_server.flushall(client)
        client.close()


@pytest.fixture
def manual_clock() -> ManualClock:
    """A :class:`ManualClock` at a fixed start, for deterministic due times and deadlines."""
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def make_queue(redis_client: redis.Redis, manual_clock: ManualClock) -> Callable[..., Queue]:
    """Factory of core ``Queue`` objects on the private server, on ``manual_clock`` by default.

    ``make_queue("name", clock=None, prefix="dq", **QueueSettings fields)``.
    """

    def make(
        name: str = "q", clock: object = None, prefix: str = "dq", **settings: object
    ) -> Queue:
        return Queue(
            redis_client,
            name,
            prefix=prefix,
            settings=QueueSettings(**settings),  # type: ignore[arg-type]
            clock=manual_clock if clock is None else clock,  # type: ignore[arg-type]
        )

    return make


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession (``local[2]``, UI off) for the whole run: Spark starts slowly.

    pyspark is imported here, not at the top, so the rest of the suite runs without it.
    """
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from django_delayqueue.spark.session import get_spark

    session = get_spark(
        "django-delayqueue-tests",
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture
def running() -> Iterator[Started]:
    """Consumers the test starts with ``running.start(...)`` (core_consumer_support.Started),
    every one stopped at its end. A test module may define its own ``running`` instead."""
    started = Started()
    yield started
    started.stop_all()
