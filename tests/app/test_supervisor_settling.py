"""supervisor/settling.py (and the supervisor loop's use of it): the messages of handlers a
child could not stop are settled without ever holding the supervisor's one thread on a Redis
that is down, kept for later, and settled once Redis is back.

Redis down: the test's own redis-server is killed (its AOF keeps the messages for the restart)
and its port is taken by a listener that accepts each connection and closes it at once,
counting them (a Redis behind a proxy, or a host that drops us). The count tells how many
times the supervisor knocked: before, it tried every message on its own (and again on every
turn of its loop), each try up to the shared client's timeouts and retries (30 s reads, 5 s
connects), deaf to SIGTERM and to its children meanwhile; now one knock per try, at most one
try per ``SETTLE_RETRY_SECONDS``, through a client without retries and with short timeouts.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_delayqueue.conf.queues import get_queue
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.core.envelope import Message
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.supervisor import settling
from django_delayqueue.supervisor.children import SupervisorOptions
from django_delayqueue.supervisor.loop import Supervisor

QUEUE = "order-close"  # demo_project's settings: max_attempts 5
AOF = ("--appendonly", "yes", "--appendfsync", "always")


class Dropping:
    """Listens on ``port``, accepting and closing every connection; ``knocks`` counts them."""

    def __init__(self, port: int) -> None:
        self.knocks = 0
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))
        self._socket.listen(64)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return  # closed
            self.knocks += 1
            conn.close()

    def close(self) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(10)


class Outage:
    """The test's own redis-server, which it can take down and bring back."""

    def __init__(self, server: RedisServerProcess) -> None:
        self.server = server
        self.dropping: Dropping | None = None

    @property
    def knocks(self) -> int:
        assert self.dropping is not None
        return self.dropping.knocks

    def down(self) -> None:
        self.server.kill()
        self.dropping = Dropping(self.server.port)

    def back(self) -> None:
        assert self.dropping is not None
        self.dropping.close()
        self.server.restart()


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outage]:
    server = RedisServerProcess(args=AOF).start()
    monkeypatch.setattr(settling, "_settling", None, raising=False)  # one for this server
    try:
        with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "REDIS_URL": server.url}):
            yield Outage(server)
    finally:
        if getattr(settling, "_settling", None) is not None:
            settling._settling[0].close()
        server.stop()


def stopped_handlers(count: int) -> list[StoppedHandler]:
    queue = get_queue(QUEUE)
    queue.schedule_many([{"payload": i} for i in range(count)])
    deliveries = queue.claim(count)
    assert len(deliveries) == count
    return [StoppedHandler.of(d, "retry", "time limit exceeded (2 s)") for d in deliveries]


def counts() -> dict[str, Any]:
    return dict(get_queue(QUEUE).counts())


def test_settling_knocks_once_while_redis_is_down_and_settles_once_it_is_back(
    outage: Outage,
) -> None:
    stopped = stopped_handlers(2)
    outage.down()

    left = settling.settle(stopped)

    # Both kept for later; one connection for both: no retry, no second message tried.
    assert left == stopped
    assert outage.knocks == 1

    outage.back()
    assert counts()["unack"] == 2  # as the stop left them
    assert settling.settle(left) == []
    after = counts()
    assert after["unack"] == 0 and after["retry"] == 2, after  # retried, attempt counted


def test_the_final_try_names_the_messages_left_in_flight(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    stopped = stopped_handlers(2)
    outage.down()
    with caplog.at_level(logging.ERROR, logger=settling.__name__):
        assert settling.settle(stopped, final=True) == []
    assert outage.knocks == 1
    (line,) = [r.getMessage() for r in caplog.records if "left in flight" in r.getMessage()]
    for item in stopped:
        assert f"{QUEUE}/{item.message_id}" in line
    outage.back()
    assert counts()["unack"] == 2  # back after their visibility timeout


@contextmanager
def monotonic_at(monkeypatch: pytest.MonkeyPatch, now: list[float]) -> Iterator[None]:
    from django_delayqueue.supervisor import loop

    monkeypatch.setattr(loop.time, "monotonic", lambda: now[0])
    yield


def test_the_supervisor_tries_again_at_most_once_per_retry_interval(
    outage: Outage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_delayqueue.supervisor.loop import SETTLE_RETRY_SECONDS

    supervisor = Supervisor(SupervisorOptions())
    supervisor.to_settle = stopped_handlers(1)
    outage.down()
    now = [1000.0]
    with monotonic_at(monkeypatch, now):
        supervisor._settle_left()  # a child was just reaped: at once
        assert outage.knocks == 1 and len(supervisor.to_settle) == 1
        for _ in range(5):  # the loop's next turns (a reap, a signal) do not wait on Redis
            supervisor._settle_left()
        assert outage.knocks == 1
        assert supervisor._timeout() <= SETTLE_RETRY_SECONDS
        now[0] += SETTLE_RETRY_SECONDS
        supervisor._settle_left()
        assert outage.knocks == 2
        outage.back()
        now[0] += SETTLE_RETRY_SECONDS
        supervisor._settle_left()
    assert supervisor.to_settle == []
    assert counts()["retry"] == 1


def test_the_log_says_dead_lettered_when_the_stop_used_the_last_attempt(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    # Found using it as a shop: a hung handler stopped on its last attempt went to the dead
    # letters while the supervisor's log line said "retried".
    queue = get_queue(QUEUE)
    queue.schedule_many([{"payload": 1}])
    (delivery,) = queue.claim(1)
    last = StoppedHandler.of(delivery, "retry", "time limit exceeded (2 s)")
    queue.client.hset(queue.keys.attempts, delivery.id, 5)  # demo's max_attempts: the last
    with caplog.at_level(logging.WARNING, logger=settling.__name__):
        assert settling.settle([last]) == []
    (line,) = [r.getMessage() for r in caplog.records if "stopped (" in r.getMessage()]
    assert line.endswith("dead-lettered"), line
    assert counts()["garbage"] == 1


def test_a_stopped_message_its_own_process_settled_is_not_said_to_have_timed_out(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    """A coroutine stopped at its limit while a thread it started runs on keeps its process
    until that thread ends; the process then records the retry itself, and the supervisor's
    settle finds the token spent. The log said "its visibility timeout had already brought it
    back", which sent readers looking for an expired lease that never was."""
    (item,) = stopped_handlers(1)
    queue = get_queue(QUEUE)
    held = Message(item.message_id, item.queue, None, 0, 0, item.attempt, item.token)
    assert queue.nack(held, delay=60, reason="time limit exceeded (2 s)") == 1  # its own
    with caplog.at_level(logging.WARNING, logger="django_delayqueue.supervisor.settling"):
        assert settling.settle([item], final=True) == []
    (line,) = [r.getMessage() for r in caplog.records if item.message_id in r.getMessage()]
    assert "visibility timeout had already" not in line
    assert "already settled" in line


@pytest.fixture
def own_settling_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(settling, "_settling", None)
    yield
    if settling._settling is not None:
        settling._settling[0].close()


def test_a_queue_redis_refuses_for_good_holds_back_no_other_queue(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch, own_settling_client: None
) -> None:
    """A release.lua refused for good on one queue (a key of the wrong type: a script error,
    not an outage) gives that queue's messages up to their visibility timeout, at once. Before,
    it was taken for Redis being down: that queue and every one after it were kept and tried
    again every SETTLE_RETRY_SECONDS for the supervisor's whole life, and no stopped handler
    of any queue was settled meanwhile (review of the start marks)."""
    from django_delayqueue.supervisor import loop
    from django_delayqueue.supervisor.start_marks import Unstarted

    healthy, broken = get_queue("order-close"), get_queue("activation-sms")
    healthy.schedule_many([{"payload": 1}, {"payload": 2}])
    unstarted, running = healthy.claim(2)
    broken.schedule_many([{"payload": 3}])
    (other,) = broken.claim(1)
    redis_client.set(broken.keys.aborts, "not a hash")  # release.lua's guard fails there

    sup = Supervisor(SupervisorOptions())
    sup.to_give_back = [
        Unstarted(broken.name, other.id, other.token, None, 111),
        Unstarted(healthy.name, unstarted.id, unstarted.token, None, 222),
    ]
    sup.to_settle = [StoppedHandler.of(running, "retry", "time limit exceeded (2 s)")]
    now = [1000.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: now[0])
    sup._settle_left()

    assert healthy.client.lrange(healthy.keys.ready, 0, -1) == [unstarted.id.encode()]
    assert healthy.client.hget(healthy.keys.attempts, unstarted.id) is None  # no attempt used
    assert sup.to_give_back == [] and sup.to_settle == []
    assert healthy.client.zscore(healthy.keys.retry, running.id) is not None  # retried
    assert broken.client.zscore(broken.keys.unack, other.id) is not None  # left to its lease


def test_refusals_that_pass_by_themselves_are_kept_for_another_try() -> None:
    """A failover's or a moving cluster's refusal is not a refusal for good: kept."""
    import redis

    from django_delayqueue.core.errors import RedisUnavailable, ScriptFailed

    assert settling.refused_for_good(ScriptFailed("release.lua failed: WRONGTYPE Operation"))
    assert settling.refused_for_good(redis.ResponseError("ERR Error running script"))
    for passing in (
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.ResponseError("MASTERDOWN Link with MASTER is down"),
        redis.ResponseError("BUSY Redis is busy running a script."),
        ScriptFailed("release.lua failed: READONLY You can't write against a read only replica"),
        RedisUnavailable("Redis unavailable during release: Connection refused"),
        redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
    ):
        assert not settling.refused_for_good(passing), passing
