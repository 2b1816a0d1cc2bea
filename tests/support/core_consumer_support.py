"""Helpers for the core Consumer tests: bounded runs on threads, recording handlers, waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from waiting import TIMEOUT

from django_delayqueue.core import STATES, Message, Queue
from django_delayqueue.core.consumer.handlers.threads import HandlerThreads
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.outcomes import Outcome

T0 = 1_700_000_000_000  # the manual_clock fixture's start
EMPTY = dict.fromkeys(STATES, 0)


class Running:
    """A consumer running ``run()`` on a thread; ``stop()`` always ends it."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.result: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.result = self.consumer.run()

    def join(self, timeout: float = TIMEOUT) -> int | None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop()
            pytest.fail("consumer did not finish in time")
        return self.result

    def stop(self) -> None:
        self.consumer.request_stop()
        self.thread.join(TIMEOUT)
        if self.thread.is_alive():
            self.consumer.request_stop()  # the second request stops at once
            self.thread.join(TIMEOUT)


class Started:
    """The consumers a test started; ``stop_all()`` (in a fixture's teardown) ends them."""

    def __init__(self) -> None:
        self.runs: list[Running] = []

    def __call__(self, consumer: Consumer) -> Running:
        self.runs.append(Running(consumer))
        return self.runs[-1]

    def stop_all(self) -> None:
        for r in self.runs:
            if r.thread.is_alive():
                r.stop()


class Ticks:
    """A monotonic clock (seconds) the test moves: ``ticks.now += 2``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A handler that records deliveries and does what ``behaviour`` says."""

    def __init__(self, behaviour: Callable[[Message], Any] | None = None) -> None:
        self.behaviour = behaviour
        self.calls: list[Message] = []
        self.started_ms: list[float] = []  # local wall clock (= a SystemClock queue's clock)
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> Any:
        with self.lock:
            self.started_ms.append(time.time() * 1000)
            self.calls.append(message)
        if self.behaviour:
            return self.behaviour(message)
        return None

    @property
    def payloads(self) -> list[Any]:
        return [m.payload for m in self.calls]


def burst(queues: list[Queue], handler: Callable[[Message], Any], **kwargs: Any) -> Consumer:
    """Run a burst consumer to its end (bounded) and return it."""
    consumer = Consumer(queues, handler, burst=True, **kwargs)
    r = Running(consumer)
    assert r.join() == 0
    return consumer


class _NoConsumer:
    """What handler threads need of a consumer, for tests of the threads alone: ``work`` runs
    each message, and there is no loop to wake."""

    def __init__(self, work: Callable[[Message], Outcome]) -> None:
        self.deliver = work

    def handler_thread_exit(self) -> None:
        pass

    def may_run_async(self) -> bool:
        return False

    def nudge(self) -> None:
        pass

    def remind(self, at_monotonic: float) -> None:
        pass


def threads_alone(
    size: int, work: Callable[[Message], Outcome], monotonic: Callable[[], float] | None = None
) -> HandlerThreads:
    """Queue "q"'s handler threads, ``size`` of them, running ``work``, with no consumer;
    ``monotonic``: the loop's clock that times refills (``HandlerThreads.refilled``)."""
    alone = _NoConsumer(work)
    if monotonic is None:
        return HandlerThreads("q", size, alone, alone)
    return HandlerThreads("q", size, alone, alone, monotonic=monotonic)


def keeper_rounds(
    keeper: Any, queues: list[Queue], client: Any, now_ms: int, rounds: int = 2
) -> None:
    """Drive a ScheduleKeeper as a consumer's rounds do, without a consumer: the first round
    reads the schedule states, the next one plans and advances."""
    from django_delayqueue.core.scripts.calls import ScriptBatch

    for _ in range(rounds):
        for q in queues:
            batch = ScriptBatch()
            entries = keeper.add_to(batch, [q], now_ms)
            keeper.read(entries, batch.run(client), now_ms)
