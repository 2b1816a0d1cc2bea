"""The consumer's start marks (core/consumer/start_marks.py): what it claimed is marked as the
claim's reply is taken in, and the mark is cleared before the handler is called, or once the
consumer gave the message back itself at a stop: a mark left is a delivery whose handler never
ran (the supervisor gives those back uncharged once the process is gone)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from core_consumer_support import Recorder
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.claim_ahead import ClaimAhead


class Marks:
    """A StartMarks that remembers: what is marked now, and every mark made."""

    def __init__(self) -> None:
        self.live: set[tuple[str, str]] = set()
        self.made: list[str] = []
        self.lock = threading.Lock()

    def mark(self, messages: Sequence[Message]) -> None:
        with self.lock:
            for m in messages:
                self.live.add((m.queue, m.token))
                self.made.append(m.id)

    def clear(self, message: Message) -> None:
        with self.lock:
            self.live.discard((message.queue, message.token))

    def holds(self, message: Message) -> bool:
        with self.lock:
            return (message.queue, message.token) in self.live


def test_a_mark_is_cleared_before_its_handler_is_called(make_queue: Any) -> None:
    q = make_queue(claim_batch=10)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(5)])
    marks = Marks()
    marked_at_call: list[bool] = []
    handler = Recorder(lambda m: marked_at_call.append(marks.holds(m)))
    consumer = Consumer([q], handler, burst=True, start_marks=marks)
    assert consumer.run() == 0
    assert sorted(marks.made) == [f"m{i}" for i in range(5)]
    assert marked_at_call == [False] * 5
    assert marks.live == set()


def test_a_coroutine_s_mark_is_cleared_before_its_handler_is_called(make_queue: Any) -> None:
    q = make_queue(claim_batch=10)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
    marks = Marks()
    seen: list[bool] = []

    async def handler(message: Message) -> None:
        seen.append(marks.holds(message))

    consumer = Consumer([q], handler, burst=True, concurrency=3, start_marks=marks)
    assert consumer.run() == 0
    assert sorted(marks.made) == ["m0", "m1", "m2"] and seen == [False] * 3
    assert marks.live == set()


def test_what_a_stop_gives_back_unstarted_is_no_longer_marked(
    redis_client: redis.Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claimed ahead of the one busy thread, marked; the consumer gives them back at its stop
    (release.lua), then clears their marks: nothing is left for a supervisor to give back."""
    monkeypatch.setattr(ClaimAhead, "count", lambda self, threads, claim_batch: claim_batch)
    q = make_queue(claim_batch=10)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(4)])
    started, proceed = threading.Event(), threading.Event()

    def slow_first(m: Message) -> None:
        started.set()
        assert proceed.wait(TIMEOUT)

    marks = Marks()
    consumer = Consumer(
        [q], Recorder(slow_first), concurrency=1, grace_seconds=600, start_marks=marks
    )
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(consumer.run()))
    thread.start()
    try:
        assert started.wait(TIMEOUT)
        # m0 runs (its mark cleared), m1..m3 wait claimed behind it, marked.
        wait_until(lambda: len(marks.live) == 3, TIMEOUT, "the claimed-ahead marked")
        assert sorted(marks.made) == ["m0", "m1", "m2", "m3"]
        consumer.request_stop()
        wait_until(lambda: redis_client.llen(q.keys.ready) == 3, TIMEOUT, "given back")
        wait_until(lambda: not marks.live, TIMEOUT, "their marks cleared")
    finally:
        proceed.set()
        thread.join(TIMEOUT)
    assert result == [0]
