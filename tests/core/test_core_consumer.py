"""The core Consumer loop with a plain function handler: outcomes, burst mode, the journal.

Runs use a ManualClock in burst mode, so due times, retry times and journal times are exact.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from core_consumer_support import EMPTY, T0, Recorder, Started, burst

from django_delayqueue.core import Message, Reject, Retry
from django_delayqueue.core import consumer as consumer_package
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.journal import JOURNAL_FIELDS


@pytest.fixture
def running() -> Iterator[Started]:
    """``running(consumer)`` starts ``consumer.run()`` on a thread, stopped after the test."""
    started = Started()
    yield started
    started.stop_all()


# --- outcomes of a handler ------------------------------------------------------------------------


def test_return_acknowledges(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i} for i in range(3)])
    handler = Recorder()
    consumer = burst([q], handler)
    assert sorted(handler.payloads) == [0, 1, 2]
    assert all(m.attempt == 1 and m.queue == "q" for m in handler.calls)
    assert consumer.delivered == 3
    assert q.counts() == EMPTY
    assert redis_client.hlen(q.keys.messages) == 0
    assert redis_client.hlen(q.keys.attempts) == 0


def test_retry_with_a_delay(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="x")

    def handler(m: Message) -> None:
        raise Retry(delay=7.5, reason="not yet")

    burst([q], handler)
    assert q.counts() == {**EMPTY, "retry": 1}
    assert redis_client.zscore(q.keys.retry, "x") == T0 + 7_500
    assert redis_client.hget(q.keys.reasons, "x") == b"not yet"


def test_reject_goes_to_garbage_with_its_reason(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue(max_attempts=5)
    q.schedule("x", id="x")

    def handler(m: Message) -> None:
        raise Reject("why")

    burst([q], handler)
    assert q.counts() == {**EMPTY, "garbage": 1}
    assert redis_client.hget(q.keys.reasons, "x") == b"why"


def test_exception_retries_with_backoff_then_goes_to_garbage(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=3, backoff_base=10, backoff_max=1000)
    q.schedule("x", id="x")

    def handler(m: Message) -> None:
        raise ValueError("boom")

    recorder = Recorder(handler)
    for attempt, full_backoff_ms in ((1, 10_000), (2, 20_000)):
        burst([q], recorder)
        assert recorder.calls[-1].attempt == attempt
        now = manual_clock.now_ms()
        retry_at = redis_client.zscore(q.keys.retry, "x")
        assert now + full_backoff_ms / 2 <= retry_at <= now + full_backoff_ms
        assert redis_client.hget(q.keys.reasons, "x") == b"ValueError: boom"
        burst([q], recorder)  # not due yet: nothing delivered
        assert len(recorder.calls) == attempt
        manual_clock.set(int(retry_at))
    burst([q], recorder)
    assert [m.attempt for m in recorder.calls] == [1, 2, 3]
    assert q.counts() == {**EMPTY, "garbage": 1}
    assert redis_client.hget(q.keys.reasons, "x") == b"no attempts left (3 of 3): ValueError: boom"


# --- burst, max_messages, several queues ----------------------------------------------------------


def test_burst_delivers_everything_due_now_and_returns(make_queue: Any) -> None:
    q = make_queue(claim_batch=7, promote_batch=10)
    q.schedule_many([{"payload": i, "delay": 0 if i < 40 else 60} for i in range(45)])
    handler = Recorder()
    burst([q], handler, concurrency=3)
    assert sorted(handler.payloads) == list(range(40))
    assert q.counts() == {**EMPTY, "pending": 5}


def test_burst_promotes_a_backlog_larger_than_one_promote(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(promote_batch=5, claim_batch=3)
    q.schedule_many([{"payload": i, "delay": 1} for i in range(23)])
    manual_clock.advance(1)
    handler = Recorder()
    burst([q], handler)
    assert sorted(handler.payloads) == list(range(23))
    assert q.counts() == EMPTY


def test_burst_serves_several_queues(make_queue: Any) -> None:
    a, b = make_queue("a"), make_queue("b")
    a.schedule("to a")
    b.schedule("to b")
    handler = Recorder()
    burst([a, b], handler)
    assert sorted((m.queue, m.payload) for m in handler.calls) == [("a", "to a"), ("b", "to b")]
    assert a.counts() == b.counts() == EMPTY


def test_paused_queue_is_not_claimed(make_queue: Any) -> None:
    q = make_queue(paused=True)
    q.schedule("x")
    handler = Recorder()
    burst([q], handler)
    assert handler.calls == []
    assert q.counts() == {**EMPTY, "ready": 1}


def test_max_messages(make_queue: Any, running: Any) -> None:
    q = make_queue(claim_batch=100)
    q.schedule_many([{"payload": i} for i in range(5)])
    handler = Recorder()
    consumer = Consumer([q], handler, max_messages=3, idle_seconds=0.1)
    assert running(consumer).join() == 0
    assert handler.payloads == [0, 1, 2]
    assert q.counts() == {**EMPTY, "ready": 2}


# --- the journal ----------------------------------------------------------------------------------


def test_journal_records_each_outcome(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue(max_attempts=5)
    q.schedule_many([{"payload": p, "id": p} for p in ("ok", "retry", "reject", "boom")])

    def handler(m: Message) -> None:
        if m.payload == "retry":
            raise Retry(delay=1)
        if m.payload == "reject":
            raise Reject("no")
        if m.payload == "boom":
            raise KeyError("k")

    burst([q], handler)
    entries = redis_client.xrange(q.keys.journal)
    assert entries
    rows = []
    for _, fields in entries:
        assert set(fields) == {b"n", b"o"}
        batch = json.loads(fields[b"o"])
        assert int(fields[b"n"]) == len(batch)
        rows += [dict(zip(JOURNAL_FIELDS, row, strict=True)) for row in batch]
    by_id = {row["id"]: row for row in rows}
    assert {i: (r["outcome"], r["error"]) for i, r in by_id.items()} == {
        "ok": ("ack", ""),
        "retry": ("retry", "Retry"),
        "reject": ("garbage", "Reject"),
        "boom": ("retry", "KeyError"),
    }
    for row in rows:
        assert row["scheduled_ms"] == row["due_ms"] == T0
        assert row["delivered_ms"] == T0 and row["finished_ms"] >= T0
        assert row["attempt"] == 1


def test_journal_can_be_switched_off(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x")
    burst([q], Recorder(), journal_maxlen=0)
    assert q.counts() == EMPTY
    assert not redis_client.exists(q.keys.journal)


def test_consumer_works_after_script_flush(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i} for i in range(3)])
    redis_client.script_flush()
    handler = Recorder()
    burst([q], handler)
    assert sorted(handler.payloads) == [0, 1, 2]
    assert q.counts() == EMPTY


def test_a_broken_heartbeats_key_loses_no_claimed_message(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i} for i in range(3)])
    redis_client.set(q.keys.heartbeats, "not a sorted set")  # the heartbeat write fails
    handler = Recorder()
    burst([q], handler, maintenance_seconds=0)
    assert sorted(handler.payloads) == [0, 1, 2]
    assert q.counts() == EMPTY


# --- one undecodable envelope costs only its own message ---------------------------------------


@pytest.mark.parametrize(
    "payload_json,reason",
    [
        # Deeper than any recursion limit lets json decode (an old producer, another language):
        # RecursionError in the consumer, which failed the whole round.
        ("[" * 100_000 + "]" * 100_000, "nests too deeply to decode"),
        # Past Python's int-string limit (4300 digits): json raises ValueError.
        ("9" * 5000, "corrupt: envelope payload is not JSON"),
    ],
    ids=["too-deep", "huge-int"],
)
def test_an_undecodable_payload_is_buried_and_the_messages_claimed_with_it_are_delivered(
    redis_client: redis.Redis, make_queue: Any, payload_json: str, reason: str
) -> None:
    q = make_queue(claim_batch=10)
    q.schedule({"n": 1}, id="a")
    # Written straight into Redis, bypassing schedule(), as another producer would.
    redis_client.hset(q.keys.messages, "bad", f"{T0:x},0,{payload_json}")
    redis_client.rpush(q.keys.ready, "bad")
    q.schedule_many([{"payload": {"n": 2}, "id": "b"}, {"payload": {"n": 3}, "id": "c"}])
    handler = Recorder()
    consumer = burst([q], handler)
    assert sorted(m.id for m in handler.calls) == ["a", "b", "c"]  # claimed with it, and acked
    assert consumer.delivered == 3
    assert q.counts() == {**EMPTY, "garbage": 1}
    assert redis_client.zscore(q.keys.garbage, "bad") is not None
    assert reason in redis_client.hget(q.keys.reasons, "bad").decode()
    assert redis_client.hlen(q.keys.messages) == 1  # only the dead letter's envelope is left


@pytest.mark.parametrize(
    "failure",
    [
        OSError("cannot read " + os.fsdecode(b"r\xffport.pdf")),
        Reject(os.fsdecode(b"r\xffport.pdf") + " is gone"),
    ],
    ids=["exception", "reject"],
)
def test_a_reason_holding_a_lone_surrogate_is_recorded_escaped(
    redis_client: redis.Redis, make_queue: Any, failure: Exception
) -> None:
    # A file name os.fsdecode could not decode, in an exception's text. Before: redis-py could
    # not encode the nack, so every round's recording failed again and the consumer never
    # acked anything (nor returned from burst).
    q = make_queue(max_attempts=1)
    q.schedule("bad", id="bad")
    q.schedule("good", id="good")

    def handler(m: Message) -> None:
        if m.id == "bad":
            raise failure

    consumer = burst([q], Recorder(handler))
    assert consumer.delivered == 2
    assert q.counts() == {**EMPTY, "garbage": 1}
    assert "r\\udcffport.pdf" in redis_client.hget(q.keys.reasons, "bad").decode()


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_consumer_delivers_on_either_redis_protocol(
    redis_server: Any, redis_client: redis.Redis, protocol: int
) -> None:
    """The library builds its clients RESP2, but a client handed to it (a django-redis cache's,
    say) may speak RESP3, redis-py 8's default: the replies it parses mean the same either way.
    """
    from django_delayqueue.core import Queue, SystemClock

    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    try:
        q = Queue(client, "q", clock=SystemClock())
        q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
        q.schedule("later", id="later", delay=3600)
        handler = Recorder()
        burst([q], handler)
        assert sorted(handler.payloads) == [0, 1, 2]
        assert q.counts() == {**EMPTY, "pending": 1}
        assert [m.id for m in q.peek("pending").messages] == ["later"]
    finally:
        client.close()


# --- its shape ------------------------------------------------------------------------------------


def test_the_consumer_owns_its_parts_and_inherits_none() -> None:
    """Before: ``Consumer(HandlerDelivery, HandlerStops, RoundPlanning)``, three mixins that
    re-declared each other's attributes. Now each part is a class of its own, given what it
    needs; no class of the consumer's package extends another of it but a Protocol (an
    interface) or a NamedTuple."""
    assert Consumer.__bases__ == (object,)
    source = Path(consumer_package.__file__).resolve().parent
    trees = {p: ast.parse(p.read_text()) for p in sorted(source.rglob("*.py"))}
    classes = {
        n.name: n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)
    }
    interfaces = {
        name
        for name, node in classes.items()
        if any(ast.unparse(b) in ("Protocol", "NamedTuple") for b in node.bases)
    }
    inherited = [
        f"{name}({ast.unparse(base)})"
        for name, node in classes.items()
        for base in node.bases
        if ast.unparse(base) in classes and ast.unparse(base) not in interfaces
    ]
    assert inherited == []
