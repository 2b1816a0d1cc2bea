"""Progress of running deliveries (core/progress.py, core/consumer/handlers/progress_reports.py,
lua/progress.lua): checked, written only by the current delivery, gone with it, and sent by a
running consumer from its handler threads and coroutines.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from typing import Any

import pytest
import redis
from waiting import TIMEOUT, wait_until

import django_delayqueue as dq
from django_delayqueue.core import Message, SystemClock
from django_delayqueue.core.consumer.handlers.progress_reports import REPORTS, send_reports
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.progress import (
    MAX_NOTE_CHARS,
    Progress,
    checked_progress,
    decode_progress,
)


@pytest.mark.parametrize("bad", [-0.1, 100.5, math.nan, math.inf, "50", None, True, [1]])
def test_a_percent_out_of_range_or_not_a_number_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="percent"):
        checked_progress(bad)


def test_a_note_is_a_str_cut_to_its_limit() -> None:
    assert checked_progress(0) == (0.0, "")
    assert checked_progress(100, "done") == (100.0, "done")
    percent, note = checked_progress(12.5, "x" * 1000)
    assert percent == 12.5 and len(note) == MAX_NOTE_CHARS and note.endswith("…")
    assert checked_progress(1, "file \udcff")[1] == "file \\udcff"  # sendable to Redis
    with pytest.raises(ValueError, match="note"):
        checked_progress(1, b"bytes")


def test_progress_outside_a_handler_sends_nothing(make_queue: Any) -> None:
    q = make_queue("nothing-runs")
    message = q.prepare("x", id="m")
    assert dq.progress(50, "x") is False
    assert Message("m", q.name, "x", message.due_ms, 0, 1, "token").progress(50) is False
    assert REPORTS.take(q.name) == []
    with pytest.raises(ValueError):
        dq.progress(101)


def _stored(client: redis.Redis, q: Any, message_id: str) -> Progress | None:
    return decode_progress(client.hget(q.keys.progress, message_id))


def test_only_the_current_delivery_writes_its_progress(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(visibility_timeout=5)
    q.schedule("x", id="m")
    (first,) = q.claim(1)
    assert q.write_progress([("m", first.token, 10.0, "first try")]) == 1
    stored = _stored(redis_client, q, "m")
    assert stored is not None and stored.percent == 10.0 and stored.note == "first try"
    assert stored.at_ms == manual_clock.now_ms()
    # Its consumer died: reaped to retry, its progress gone; a report of it is refused.
    manual_clock.advance(6)
    assert q.reap().retried == 1
    assert redis_client.exists(q.keys.progress) == 0
    assert q.write_progress([("m", first.token, 20.0, "late")]) == 0
    manual_clock.advance(60)
    q.promote()
    (second,) = q.claim(1)
    assert q.write_progress([("m", second.token, 5.0, "second try")]) == 1
    # The stopped first handler's late report does not overwrite the redelivery's.
    assert q.write_progress([("m", first.token, 90.0, "stale")]) == 0
    stored = _stored(redis_client, q, "m")
    assert stored is not None and (stored.percent, stored.note) == (5.0, "second try")
    assert q.progress_of("m", "other") == {"m": stored}
    assert q.ack(second) == 1
    assert redis_client.exists(q.keys.progress) == 0
    assert q.write_progress([("m", second.token, 100.0, "after ack")]) == 0


@pytest.mark.parametrize("end", ["nack", "dead", "release"])
def test_every_end_of_a_delivery_deletes_its_progress(
    redis_client: redis.Redis, make_queue: Any, end: str
) -> None:
    q = make_queue()
    q.schedule("x", id="m")
    (m,) = q.claim(1)
    assert q.write_progress([("m", m.token, 42.0, "")]) == 1
    if end == "nack":
        assert q.nack(m, delay=10, reason="boom") == 1
    elif end == "dead":
        assert q.bury(m, "poison")
    else:
        assert q.release(m) == 1
    assert redis_client.exists(q.keys.progress) == 0


def test_cancel_and_purge_delete_a_leftover(redis_client: redis.Redis, make_queue: Any) -> None:
    # No delivery leaves one behind; were one there (a key written by hand), it goes with its
    # message all the same.
    q = make_queue()
    q.schedule("x", id="waiting", delay=60)
    q.schedule("y", id="dead")
    (m,) = q.claim(1)
    q.bury(m, "poison")
    redis_client.hset(q.keys.progress, mapping={"waiting": "{}", "dead": "{}"})
    assert q.cancel("waiting") == 1
    assert q.purge("dead") == 1
    assert redis_client.exists(q.keys.progress) == 0


def test_a_handler_thread_reports_progress_coalesced_and_gone_after_ack(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue("progress-threads", clock=SystemClock())
    q.schedule("job", id="j")
    reported, finish = threading.Event(), threading.Event()
    answers: list[bool] = []

    def handler(m: Message) -> None:
        for i in range(1000):  # a tight loop: one write per tick, the latest report
            answers.append(m.progress(i / 10, f"row {i}"))
        # From a thread of the user's given the handler's context, and by the message.
        copied = contextvars.copy_context()
        worker = threading.Thread(target=copied.run, args=(dq.progress, 99.5, "copied"))
        worker.start()
        worker.join()
        reported.set()
        assert finish.wait(TIMEOUT)

    r = running(Consumer([q], handler, idle_seconds=0.1))
    assert reported.wait(TIMEOUT)
    wait_until(lambda: q.progress_of("j").get("j") is not None)
    stored = q.progress_of("j")["j"]
    assert (stored.percent, stored.note) == (99.5, "copied")
    assert all(answers) and len(answers) == 1000
    finish.set()
    wait_until(lambda: q.counts()["unack"] == 0)
    assert redis_client.exists(q.keys.progress) == 0
    r.stop()


def test_a_coroutine_handler_reports_progress(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue("progress-async", clock=SystemClock())
    q.schedule("job", id="a")
    finish = threading.Event()

    async def handler(m: Message) -> None:
        assert m.progress(30, "async")
        while not finish.is_set():
            await asyncio.sleep(0.01)

    r = running(Consumer([q], handler, idle_seconds=0.1))
    wait_until(lambda: q.progress_of("a").get("a") is not None)
    assert q.progress_of("a")["a"].note == "async"
    finish.set()
    wait_until(lambda: q.counts()["unack"] == 0)
    assert redis_client.exists(q.keys.progress) == 0
    r.stop()


def test_waiting_reports_are_sent_once_the_latest_of_each_message(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue("sent-by-tick")
    q.schedule("x", id="m")
    (m,) = q.claim(1)
    assert send_reports([q]) == 0  # nothing waits for it
    REPORTS.put(m, 10.0, "old")
    REPORTS.put(m, 20.0, "new")
    assert send_reports([q]) == 1
    assert q.progress_of("m")["m"].note == "new"
    assert send_reports([q]) == 0  # taken: sent once
    # A delivery its consumer no longer holds (ended since): dropped before Redis.
    REPORTS.put(m, 30.0, "ended")
    assert send_reports([q], lambda name: []) == 0
    assert q.progress_of("m")["m"].note == "new"
    REPORTS.put(m, 40.0, "held")
    assert send_reports([q], lambda name: [m] if name == q.name else []) == 1
    assert q.progress_of("m")["m"].note == "held"


def test_a_sharded_queue_reads_each_id_s_progress_on_its_shard(
    redis_client: redis.Redis, manual_clock: Any
) -> None:
    from django_delayqueue.core import Queue
    from django_delayqueue.core.sharding import ShardedQueue

    sharded = ShardedQueue(
        [Queue(redis_client, "orders", shard=i, clock=manual_clock) for i in range(3)]
    )
    ids = [f"m{i}" for i in range(6)]
    for message_id in ids:
        sharded.schedule("x", id=message_id)
    claimed = [m for shard in sharded.shards for m in shard.claim(10)]
    assert sorted(m.id for m in claimed) == ids
    for shard in sharded.shards:
        mine = [m for m in claimed if m.queue == shard.name]
        written = shard.write_progress([(m.id, m.token, 50.0, m.queue) for m in mine])
        assert written == len(mine)
    found = sharded.progress_of(*ids, "unknown")
    assert sorted(found) == ids
    assert all(found[m.id].note == m.queue for m in claimed)  # "orders#<shard>"
