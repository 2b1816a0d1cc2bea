"""Aborts (core/consumer/limits/aborts.py, lua/abort.lua): recorded only for a message in flight,
cleaned up with its delivery, never retried; learnt by a running consumer, cooperative first,
then forced after abort_grace_seconds.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
import redis
from core_consumer_support import Ticks
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message, SystemClock
from django_delayqueue.core.consumer.limits.aborts import parse_abort
from django_delayqueue.core.consumer.limits.runs import abort_requested
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.errors import Aborted


def test_an_abort_of_a_waiting_or_unknown_message_changes_nothing(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("later", id="p", delay=60)
    q.schedule("now", id="r")
    for mid, state in (("p", "pending"), ("r", "ready"), ("nope", "")):
        result = q.abort(mid, "why")
        assert not result and result.state == state
        assert "is not running" in result.message
    assert "cancel it instead" in q.abort("p").message
    assert "no such message" in q.abort("nope").message
    assert redis_client.exists(q.keys.aborts) == 0


def test_an_abort_in_flight_is_recorded_then_buried_by_nack_and_reap(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=5)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
    m0, m1, _ = q.claim(3)
    assert q.abort("m0", "by ann")
    assert q.abort("m1") and q.abort("m2", "x")
    assert parse_abort(redis_client.hget(q.keys.aborts, "m0")) == (m0.token, "by ann")
    assert q.abort("m0", "again").running  # the first reason stays
    assert parse_abort(redis_client.hget(q.keys.aborts, "m0")) == (m0.token, "by ann")
    # The handler failed after the abort: never a retry.
    assert q.nack(m0, reason="boom") == 3  # dead letters as aborted (NACK_ABORTED)
    assert redis_client.hget(q.keys.reasons, "m0") == b"aborted: by ann"
    # Its acknowledgement came first: the entry goes with the message.
    assert q.ack(m1) == 1
    # Its consumer died: the reap buries it too.
    manual_clock.advance(6)
    assert q.reap().buried == 1
    assert redis_client.hget(q.keys.reasons, "m2") == b"aborted: x"
    assert redis_client.exists(q.keys.aborts) == 0
    assert q.counts()["garbage"] == 2
    assert q.requeue("m0", "m2") == 2  # requeued from the dead letters like any other
    assert q.counts()["ready"] == 2


def test_an_aborted_message_released_unstarted_is_buried(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="m")
    (m,) = q.claim(1)
    assert q.abort("m", "stop")
    assert q.release(m) == 0
    assert redis_client.hget(q.keys.reasons, "m") == b"aborted: stop"
    assert q.counts()["garbage"] == 1 and redis_client.exists(q.keys.aborts) == 0


def test_cooperative_abort_turns_message_aborted_true_and_ends_in_dead_letters(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue("long", clock=SystemClock(), abort_grace_seconds=600)
    q.schedule("job", id="j")
    started, seen = threading.Event(), []
    consumer = Consumer([q], lambda m: None, idle_seconds=0.1)

    def long_job(m: Message) -> str:
        started.set()
        while not m.aborted:
            threading.Event().wait(0.01)
        seen.append((abort_requested(), consumer.abort_reason_for(m)))
        return "stopped cleanly"  # an ack asked for: dead letters all the same

    consumer.handler = long_job
    r = running(consumer)
    assert started.wait(TIMEOUT)
    assert q.abort("j", "by staff").running
    wait_until(lambda: q.counts()["garbage"] == 1)
    assert seen == [(True, "by staff")]
    assert redis_client.hget(q.keys.reasons, "j") == b"aborted: by staff"
    assert not abort_requested()  # outside a handler
    r.stop()


def test_forced_abort_after_the_grace_period(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue("stubborn", clock=SystemClock(), abort_grace_seconds=0.2)
    q.schedule("job", id="j")
    started, stopped_by = threading.Event(), []

    def stubborn(m: Message) -> None:
        started.set()
        try:
            while True:
                pass
        except Aborted as e:
            stopped_by.append(str(e))
            raise

    r = running(Consumer([q], stubborn, idle_seconds=0.1))
    assert started.wait(TIMEOUT)
    assert q.abort("j")
    wait_until(lambda: q.counts()["garbage"] == 1)
    assert stopped_by == ["aborted"]
    assert redis_client.hget(q.keys.reasons, "j") == b"aborted"
    r.stop()


# --- issue 36 §4: an abort wins over a limit that comes in its grace ---------------------------


def journal_rows(client: redis.Redis, q: Any) -> list[tuple[int, str, str]]:
    """(attempt, status, error) of each journal row of ``q``."""
    rows = [row for _, f in client.xrange(q.keys.journal) for row in json.loads(f[b"o"])]
    return [(row[5], row[6], row[7]) for row in rows]


def told(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_time_limit_in_an_aborts_grace_stops_the_handler_as_the_abort(
    redis_client: redis.Redis,
    make_queue: Any,
    running: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the watchdog stopped it at its time limit (TimeLimitExceeded raised in it, the
    log line "time limit exceeded ... stopping its handler", a task's record saying so) while
    its message went to the dead letters as aborted."""
    q = make_queue("reports", clock=SystemClock(), abort_grace_seconds=600, max_attempts=3)
    q.schedule("job", id="j")
    started, saw_abort = threading.Event(), threading.Event()
    caught: list[str] = []  # what the handler's `except Exception` saw
    ended_by: list[str] = []

    def ignores_its_abort(m: Message) -> None:
        started.set()
        while not m.aborted:
            threading.Event().wait(0.01)
        saw_abort.set()
        try:
            while True:
                try:
                    while True:
                        pass
                except Exception as e:  # a soft limit, were one raised
                    caught.append(type(e).__name__)
        except BaseException as e:
            ended_by.append(type(e).__name__)
            raise

    consumer = Consumer([q], ignores_its_abort, idle_seconds=0.1)
    running(consumer)
    assert started.wait(TIMEOUT)
    assert q.abort("j", "by staff").running
    assert saw_abort.wait(TIMEOUT)
    # Limits set in the admin, already past, in the abort's grace (600 s): the soft one first...
    q.settings = q.settings.replace(soft_time_limit=0.1)
    (run,) = consumer._runs.all()
    wait_until(lambda: run.soft_sent)  # its time was looked at (and it was not raised)
    q.settings = q.settings.replace(soft_time_limit=0.1, time_limit=0.2)  # ...then the hard one
    wait_until(lambda: q.counts()["garbage"] == 1 and journal_rows(redis_client, q))
    assert redis_client.hget(q.keys.reasons, "j") == b"aborted: by staff"
    assert journal_rows(redis_client, q) == [(1, "garbage", "Aborted")]
    log = told(caplog)
    assert "message j aborted (by staff) and at its time limit (0.2 s): stopping it" in log
    assert "time limit exceeded" not in log and "used its last attempt" not in log
    assert (caught, ended_by) == ([], ["Aborted"])


def test_a_coroutine_at_its_time_limit_in_an_aborts_grace_ends_as_the_abort(
    redis_client: redis.Redis,
    make_queue: Any,
    running: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: cancelled as at its time limit, its outcome a retry "time limit exceeded (30 s)",
    which nack.lua buried (aborted): the journal said retry and the log "used its last attempt:
    time limit exceeded (30 s)" on attempt 1 of 3."""
    q = make_queue("reports", clock=SystemClock(), abort_grace_seconds=600, max_attempts=3)
    q.settings = q.settings.replace(soft_time_limit=20, time_limit=30)
    q.schedule("job", id="j")
    started, saw_abort = threading.Event(), threading.Event()
    caught: list[str] = []
    ended_by: list[str] = []

    async def ignores_its_abort(m: Message) -> None:
        started.set()
        while not m.aborted:
            await asyncio.sleep(0.01)
        saw_abort.set()
        try:
            while True:
                try:
                    await asyncio.sleep(3600)
                except Exception as e:  # a soft limit, were one raised
                    caught.append(type(e).__name__)
        except BaseException as e:
            ended_by.append(type(e).__name__)
            raise

    consumer = Consumer([q], ignores_its_abort, idle_seconds=0.1)
    ticks = Ticks()  # the limits are timed on it
    monkeypatch.setattr(consumer._runs, "monotonic", ticks)  # the watchdog\'s clock
    running(consumer)
    assert started.wait(TIMEOUT)
    assert q.abort("j", "by staff").running
    assert saw_abort.wait(TIMEOUT)
    ticks.now += 21  # the soft limit comes, in the abort's grace (600 s)...
    (entry,) = consumer.coroutines.watched()[1]
    wait_until(
        lambda: entry.run is not None and entry.run.soft_sent
    )  # its time was looked at (and it was not raised)
    ticks.now += 10  # ...then the hard one
    wait_until(lambda: q.counts()["garbage"] == 1 and journal_rows(redis_client, q))
    assert redis_client.hget(q.keys.reasons, "j") == b"aborted: by staff"
    assert journal_rows(redis_client, q) == [(1, "garbage", "Aborted")]
    log = told(caplog)
    assert "time limit exceeded" not in log and "used its last attempt" not in log
    assert (caught, ended_by) == ([], ["CancelledError"])
