"""``manage.py runqueue``: in process with call_command, and as a real subprocess for signals."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from waiting import wait_until

import django_delayqueue as dq
from django_delayqueue.core import Queue, QueueKeys
from django_delayqueue.embedded import RedisServerProcess, free_port
from django_delayqueue.management.commands.runqueue import Command
from django_delayqueue.mirror.kinds import queue_settings_mirror, set_paused
from django_delayqueue.worker import Worker

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "rq"
KEYS = QueueKeys("dq", QUEUE)
WAIT = 60.0  # bound on every subprocess wait


@pytest.fixture(autouse=True)
def rq_queue() -> Iterator[None]:
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"backoff_base": 0, "backoff_max": 0}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        yield


@pytest.fixture
def delivered() -> Iterator[list[Any]]:
    seen: list[Any] = []

    def record(message: dq.Message, **kwargs: Any) -> None:
        seen.append(message.payload)

    dq.topic(QUEUE).connect(record)
    yield seen
    dq.topic(QUEUE).disconnect(record)


# --- in process ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_burst_delivers_what_is_due_and_leaves_the_rest(
    redis_client: redis.Redis, delivered: list[Any]
) -> None:
    for n in range(3):
        dq.schedule(QUEUE, {"n": n}, on_commit=False)
    later = dq.schedule(QUEUE, {"n": "later"}, delay=3600, on_commit=False)
    call_command("runqueue", QUEUE, "--burst")
    assert sorted(p["n"] for p in delivered) == [0, 1, 2]
    assert redis_client.zrange(KEYS.pending, 0, -1) == [later.encode()]


@pytest.mark.django_db(transaction=True)
def test_without_names_every_configured_queue_is_consumed(
    redis_client: redis.Redis, delivered: list[Any]
) -> None:
    dq.schedule(QUEUE, {"n": 1}, on_commit=False)
    dq.schedule("order-close", {"order_id": 0}, on_commit=False)
    call_command("runqueue", "--burst")
    assert delivered == [{"n": 1}]
    assert dq.get_queue("order-close").counts()["ready"] == 0


@pytest.mark.django_db(transaction=True)
def test_max_messages(redis_client: redis.Redis, delivered: list[Any]) -> None:
    for n in range(3):
        dq.schedule(QUEUE, {"n": n}, on_commit=False)
    call_command("runqueue", QUEUE, "--max-messages", "1", "--burst")
    assert len(delivered) == 1
    assert dq.get_queue(QUEUE).counts()["ready"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_paused_queue_delivers_nothing(redis_client: redis.Redis, delivered: list[Any]) -> None:
    queue_settings_mirror.sync()
    set_paused(QUEUE, True)
    dq.schedule(QUEUE, {"n": 1}, on_commit=False)
    call_command("runqueue", QUEUE, "--burst")
    assert delivered == []
    set_paused(QUEUE, False)
    call_command("runqueue", QUEUE, "--burst")
    assert delivered == [{"n": 1}]


def test_unknown_queue_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="unknown queue 'nope'; configured: order-close"):
        call_command("runqueue", "nope", "--burst")


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_counts_must_be_positive(value: str) -> None:
    with pytest.raises(CommandError, match="1 or more"):
        call_command("runqueue", "--burst", "--concurrency", value)


@pytest.mark.parametrize("value", ["-5", "nan", "NaN", "inf", "soon"])
@pytest.mark.django_db(transaction=True)
def test_grace_must_be_a_finite_number_of_seconds(redis_client: redis.Redis, value: str) -> None:
    """Issue 37: ``--grace -5`` and ``--grace nan`` were silently 0 (``max(0.0, nan)`` is 0),
    ``inf`` a stop that never ends."""
    expected = f"--grace: expected a finite number of seconds, 0 or more, not '{value}'"
    with pytest.raises(CommandError, match=expected):
        call_command("runqueue", QUEUE, "--burst", "--grace", value)


@pytest.mark.parametrize("value", [-5, float("nan"), float("inf")])
@pytest.mark.django_db(transaction=True)
def test_grace_given_to_call_command_is_checked_too(
    redis_client: redis.Redis, value: float
) -> None:
    """``call_command(grace=...)`` hands the value over as it is, past the parser."""
    expected = f"--grace must be a finite number of seconds, 0 or more, not {value!r}"
    with pytest.raises(CommandError) as caught:
        call_command("runqueue", QUEUE, "--burst", grace=value)
    assert str(caught.value) == expected
    call_command("runqueue", QUEUE, "--burst", grace=0)  # no grace at all: allowed


@pytest.mark.django_db(transaction=True)
def test_verbosity_sets_the_log_level(redis_client: redis.Redis) -> None:
    logger = logging.getLogger("django_delayqueue")
    before = logger.level
    try:
        call_command("runqueue", QUEUE, "--burst", "--verbosity", "2")
        assert logger.level == logging.DEBUG
        call_command("runqueue", QUEUE, "--burst", "--verbosity", "0")
        assert logger.level == logging.WARNING
    finally:
        logger.setLevel(before)


@pytest.mark.django_db(transaction=True)
def test_signal_handlers_are_put_back(redis_client: redis.Redis) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    call_command("runqueue", QUEUE, "--burst")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_help_lists_the_options() -> None:
    text = Command().create_parser("manage.py", "runqueue").format_help()
    for option in ("QUEUE", "-c N, --concurrency N", "--burst", "--max-messages", "--grace"):
        assert option in text
    assert "SIGTERM" in text


@pytest.mark.parametrize("flag", ["-c", "--concurrency"])
@pytest.mark.django_db(transaction=True)
def test_concurrency_and_its_short_form_set_the_handler_threads(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """``runqueue order-close -c 8`` (the README's example) sizes the handler pool."""
    seen: list[list[int]] = []

    def run(worker: Worker) -> int:
        worker._start_threads()
        seen.append([worker._threads[q.name].size for q in worker.queues])
        worker._threads.close()
        return 0

    monkeypatch.setattr(Worker, "run", run)
    call_command("runqueue", QUEUE, "--burst", flag, "8")
    call_command("runqueue", QUEUE, "--burst")  # default: the queue's 'concurrency' setting (1)
    assert seen == [[8], [1]]


@pytest.fixture
def evicting() -> Iterator[redis.Redis]:
    """The settings point at a Redis with a cache's policy: it evicts keys when full."""
    with RedisServerProcess(args=("--maxmemory-policy", "allkeys-lru")) as server:
        config = {**settings.DELAYQUEUE, "REDIS_URL": server.url}
        with override_settings(DELAYQUEUE=config):
            client = redis.Redis.from_url(server.url)
            yield client
            client.close()


@pytest.mark.django_db(transaction=True)
def test_a_redis_that_evicts_keys_is_refused_at_start(
    evicting: redis.Redis, delivered: list[Any]
) -> None:
    Queue(evicting, QUEUE, prefix="dq").schedule({"n": 1})
    with pytest.raises(CommandError) as refused:
        call_command("runqueue", QUEUE, "--burst")
    text = str(refused.value)
    assert "maxmemory-policy allkeys-lru" in text and "noeviction" in text
    assert "ACCEPT_DATA_LOSS_ON_EVICTION" in text
    assert delivered == []


@pytest.mark.django_db(transaction=True)
def test_an_accepted_eviction_policy_runs_with_a_warning_at_every_start(
    evicting: redis.Redis, delivered: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    Queue(evicting, QUEUE, prefix="dq").schedule({"n": 1})
    accepted = {**settings.DELAYQUEUE, "ACCEPT_DATA_LOSS_ON_EVICTION": True}
    with override_settings(DELAYQUEUE=accepted), caplog.at_level(logging.WARNING):
        call_command("runqueue", QUEUE, "--burst")
        call_command("runqueue", QUEUE, "--burst")
    assert delivered == [{"n": 1}]
    said = [r for r in caplog.records if "maxmemory-policy allkeys-lru" in r.getMessage()]
    assert len(said) == 2 and all("Accepted by" in r.getMessage() for r in said)


# --- a real process -----------------------------------------------------------------------------


class Runqueue:
    """``manage.py runqueue`` as a child process on the demo settings with the slow queue."""

    def __init__(self, tmp_path: Path, redis_url: str, *args: str) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
            "REDIS_URL": redis_url,
            "DEMO_SLOW_QUEUE": "1",
            "DEMO_DB": str(tmp_path / "db.sqlite3"),
        }
        self.log = tmp_path / "runqueue.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runqueue", *args, "--verbosity", "2"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        def met() -> bool:
            if self.proc.poll() is not None and not condition():
                pytest.fail(
                    f"runqueue exited ({self.proc.returncode}) before {what}:\n" + self.output()
                )
            return condition()

        wait_until(met, WAIT, what, every=0.05, details=self.output)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def exit_code(self) -> int:
        try:
            return self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("runqueue did not stop:\n" + self.output())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def runqueue(tmp_path: Path) -> Iterator[Callable[..., Runqueue]]:
    started: list[Runqueue] = []

    def start(redis_url: str, *args: str) -> Runqueue:
        child = Runqueue(tmp_path, redis_url, *args)
        started.append(child)
        return child

    yield start
    for child in started:
        child.stop()


SLOW = QueueKeys("dq", "demo-slow")


def schedule_slow(client: redis.Redis, count: int, seconds: float) -> list[str]:
    queue = Queue(client, "demo-slow", prefix="dq")
    return [queue.schedule({"seconds": seconds}, id=f"slow-{i}").id for i in range(count)]


def where_are(client: redis.Redis, ids: list[str]) -> dict[str, set[str]]:
    """Which ids had their effect (done), and which are still in each state in Redis."""
    decoded = lambda values: {v.decode() for v in values}  # noqa: E731
    return {
        "done": decoded(client.lrange("demo:slow:done", 0, -1)),
        "ready": decoded(client.lrange(SLOW.ready, 0, -1)),
        "pending": decoded(client.zrange(SLOW.pending, 0, -1)),
        "retry": decoded(client.zrange(SLOW.retry, 0, -1)),
        "unack": decoded(client.zrange(SLOW.unack, 0, -1)),
        "garbage": decoded(client.zrange(SLOW.garbage, 0, -1)),
    }


@pytest.mark.slow
def test_sigterm_during_a_slow_handler_loses_nothing(
    redis_client: redis.Redis, redis_server: RedisServerProcess, runqueue: Any
) -> None:
    ids = schedule_slow(redis_client, 6, seconds=2.0)
    child = runqueue(redis_server.url, "demo-slow", "--concurrency", "2", "--grace", "30")
    child.wait_until(lambda: redis_client.llen("demo:slow:started") >= 1, "a handler started")
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0, child.output()
    state = where_are(redis_client, ids)
    started = {v.decode() for v in redis_client.lrange("demo:slow:started", 0, -1)}
    # The running handlers finished within the grace period and were acknowledged ...
    assert state["done"] == started and started
    assert not redis_client.hexists(SLOW.messages, next(iter(started)))
    # ... and the messages that never started were given back, ready for the next consumer.
    assert state["ready"] == set(ids) - started
    assert state["unack"] == state["garbage"] == state["retry"] == set()
    assert "stopping" in child.output()


@pytest.mark.slow
def test_a_second_sigterm_exits_at_once_and_still_loses_nothing(
    redis_client: redis.Redis, redis_server: RedisServerProcess, runqueue: Any
) -> None:
    ids = schedule_slow(redis_client, 4, seconds=30.0)
    child = runqueue(redis_server.url, "demo-slow", "--concurrency", "2", "--grace", "60")
    child.wait_until(lambda: redis_client.llen("demo:slow:started") >= 2, "two handlers started")
    child.signal(signal.SIGTERM)
    child.wait_until(lambda: "stopping" in child.output(), "the first signal was seen")
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0, child.output()
    state = where_are(redis_client, ids)
    assert state["done"] == set()  # 30 s handlers: none finished
    back = state["ready"] | state["retry"] | state["unack"] | state["pending"]
    assert back == set(ids)
    assert state["garbage"] == set()
    assert redis_client.hlen(SLOW.messages) == len(ids)


@pytest.mark.slow
def test_redis_down_at_start_is_waited_for(
    redis_client: redis.Redis, runqueue: Any, tmp_path: Path
) -> None:
    port = free_port()
    child = runqueue(f"redis://127.0.0.1:{port}/0", "demo-slow")
    child.wait_until(lambda: "trying again" in child.output(), "a retry was logged")
    with RedisServerProcess(port=port) as server:
        client = redis.Redis.from_url(server.url)
        (message_id,) = schedule_slow(client, 1, seconds=0)
        child.wait_until(
            lambda: client.lrange("demo:slow:done", 0, -1) == [message_id.encode()],
            "the message was delivered after Redis came up",
        )
        child.signal(signal.SIGINT)
        assert child.exit_code() == 0, child.output()
        client.close()


@pytest.mark.slow
def test_a_redis_that_comes_up_evicting_keys_stops_the_worker_before_it_delivers(
    runqueue: Any,
) -> None:
    port = free_port()
    child = runqueue(f"redis://127.0.0.1:{port}/0", "demo-slow")
    child.wait_until(lambda: "trying again" in child.output(), "a retry was logged")
    with RedisServerProcess(port=port, args=("--maxmemory-policy", "volatile-ttl")) as server:
        client = redis.Redis.from_url(server.url)
        schedule_slow(client, 1, seconds=0)
        assert child.exit_code() == 1, child.output()
        assert "maxmemory-policy volatile-ttl" in child.output()
        assert client.lrange("demo:slow:done", 0, -1) == []  # nothing delivered on it
        client.close()


# --- issue 38: a liveness probe of its own ----------------------------------------------------


LONG_AGO = 1_000_000_000  # 2001: far older than any --max-age


def touched_again(path: Path) -> bool:
    return path.exists() and path.stat().st_mtime > LONG_AGO


@pytest.mark.parametrize("redis_up", [True, False], ids=["idle", "redis-down"])
def test_runqueue_keeps_the_file_fresh_while_idle_and_while_redis_is_down(
    redis_server: Any, runqueue: Any, tmp_path: Path, redis_up: bool
) -> None:
    """The loop goes round every few seconds with nothing to deliver (its maintenance), and
    while Redis is down (its retries): a probe of the file restarts a stuck worker, never an
    idle one or one waiting for Redis. Under its supervisor, as a pod runs it."""
    alive = tmp_path / "alive"
    url = redis_server.url if redis_up else f"redis://127.0.0.1:{free_port()}/0"
    child = runqueue(url, "demo-slow", "--alive-file", str(alive))
    child.wait_until(alive.exists, "the alive file was created")
    for _ in range(2):  # touched again, and again: not once at start
        os.utime(alive, (LONG_AGO, LONG_AGO))
        child.wait_until(lambda: touched_again(alive), "the alive file was touched again")
    from django_delayqueue.alive import main as probe

    assert probe([str(alive), "--max-age", "60"]) == 0
    if not redis_up:
        assert "trying again" in child.output()
    child.signal(signal.SIGINT)
    assert child.exit_code() == 0, child.output()
