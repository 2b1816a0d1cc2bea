"""A consumer on a Redis whose memory is full (core.out_of_memory and the consumer's rounds):
it keeps delivering and acknowledging (acks free memory), drops the journal rows Redis refuses,
and says so once, not every round; and once more when Redis has room again."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from core_consumer_support import Recorder, Running, burst, keeper_rounds
from memory_support import full
from waiting import wait_until

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.out_of_memory import OutOfMemoryLog
from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper
from django_delayqueue.core.scripts.calls import ScriptBatch

OUT = "Redis is out of memory"
BACK = "Redis has room again"


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_consumer_delivers_and_acks_on_a_full_redis_and_says_so_once(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue("full", claim_batch=5)
    for n in range(20):
        q.schedule({"n": n}, id=f"m{n}")
    seen = Recorder()
    caplog.set_level(logging.WARNING)
    with full(redis_client):
        consumer = burst([q], seen, name="worker-1")  # 4 claims at least: several rounds
        assert sorted(m.id for m in seen.calls) == sorted(f"m{n}" for n in range(20))
        assert q.counts() == dict.fromkeys(q.counts(), 0)  # every one acknowledged: gone
        assert redis_client.xlen(q.keys.journal) == 0  # its rows were refused
    (said,) = warnings(caplog, OUT)  # once, not once a round
    assert said.startswith("worker-1: ") and "journal" in said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert consumer.memory.dropped == 20


def test_a_running_consumer_says_when_redis_has_room_again(
    redis_client: redis.Redis,
    make_queue: Any,
    manual_clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = make_queue("back")
    for n in range(3):
        q.schedule({"n": n}, id=f"a{n}", delay=10)
    q.schedule({"n": "later"}, id="later", delay=20)
    seen = Recorder()
    caplog.set_level(logging.WARNING)
    consumer = Consumer([q], seen, idle_seconds=0.05, maintenance_seconds=0.05)
    beat = lambda: redis_client.zscore(q.keys.heartbeats, consumer.name)  # noqa: E731
    run: Running | None = None
    try:
        with full(redis_client):
            manual_clock.advance(10)
            # Started once the server is full and the clock reads the delivery time: its first
            # round, a maintenance round, must write the heartbeat by heartbeat.lua (the plain
            # ZADD is refused). Started earlier, that round could read the time before the
            # advance, and the next maintenance round might never come: it is due by wall
            # time, but an idle consumer's wait ends by this clock, which moves only when told.
            run = Running(consumer)
            wait_until(lambda: len(seen.calls) == 3 and consumer.memory.dropped == 3)
            assert q.counts()["unack"] == 0  # acknowledged while full
            wait_until(lambda: beat() == manual_clock.now_ms())  # alive, for the health check
        manual_clock.advance(10)
        wait_until(lambda: len(seen.calls) == 4 and warnings(caplog, BACK))
    finally:
        if run is not None:
            run.stop()
    assert len(warnings(caplog, OUT)) == 1
    (back,) = warnings(caplog, BACK)
    assert "3 journal row(s)" in back
    assert redis_client.xlen(q.keys.journal) == 1  # the delivery after: journalled again


def test_the_log_says_once_and_counts_until_a_write_is_taken(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = OutOfMemoryLog(logging.getLogger("test.oom"), "outbox")
    refused = redis.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'."
    )
    caplog.set_level(logging.WARNING)
    assert not log.check(redis.exceptions.ResponseError("WRONGTYPE"), "a write")
    for _ in range(5):
        assert log.check(refused, "sending 3 row(s)", dropped=2)
    assert log.full and log.refusals == 5 and log.dropped == 10
    log.taken()
    log.taken()  # nothing more to say
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("outbox: Redis is out of memory") and "sending 3" in messages[0]
    assert "room again" in messages[1] and "5 write(s) refused" in messages[1]
    assert "10 journal row(s)" in messages[1] and not log.full


def test_recurring_ticks_refused_for_memory_are_said_once(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q: Queue = make_queue("reports")
    clock: ManualClock = q.clock  # type: ignore[assignment]
    keeper = ScheduleKeeper()
    keeper.set_definitions([Recurrence("digest", "reports", every=60)], [q], 0)
    caplog.set_level(logging.WARNING)
    with full(redis_client):
        for n in range(4):  # as a consumer's rounds run them: errors in place
            for _ in range(2):  # the states, then the advance
                batch = ScriptBatch()
                entries = keeper.add_to(batch, [q], clock.now_ms() + n * 60_000)
                keeper.read(entries, batch.run(redis_client, raise_errors=False), clock.now_ms())
    assert len(warnings(caplog, OUT)) == 1 and keeper.memory.refusals == 4
    assert redis_client.zcard(q.keys.pending) == 0  # no tick: refused, nothing changed
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    keeper_rounds(keeper, [q], redis_client, clock.now_ms() + 5 * 60_000)
    assert redis_client.zcard(q.keys.pending) == 1  # room again: the next tick waits
    assert len(warnings(caplog, BACK)) == 1


def test_a_consumer_with_no_journal_nor_schedules_notices_a_full_redis_by_its_heartbeat(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With JOURNAL_MAXLEN=0 and no recurring schedule no write of the consumer was refused
    but the heartbeat's ZADD, which was not counted: a full server was never logged."""
    q = make_queue("quiet")
    consumer = Consumer([q], Recorder(), journal_maxlen=0, name="worker-1")
    caplog.set_level(logging.WARNING)
    try:
        with full(redis_client):
            for _ in range(2):
                consumer._plan.next_maintenance = 0.0  # a maintenance round: writes the heartbeat
                consumer.step()
            assert consumer.memory.full and consumer.memory.refusals == 2
        consumer._plan.next_maintenance = 0.0
        consumer.step()
    finally:
        consumer._threads.close()
        consumer._waiter.close()
    (said,) = warnings(caplog, OUT)
    assert said.startswith("worker-1: ") and "heartbeat" in said
    (back,) = warnings(caplog, BACK)
    assert "2 write(s) refused" in back and not consumer.memory.full
