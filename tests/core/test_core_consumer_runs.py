"""Runs made only when needed (core/consumer/limits/runs.py): a handler thread's message gets a Run
when its queue has a time limit, when an abort of it is learnt while it runs, or when a limit is
set on its queue while it runs; never once its handler's code has ended.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message, SystemClock
from django_delayqueue.core.consumer.limits.runs import (
    Runs,
    abort_requested,
    current_run,
    handler_returned,
    stop_error,
)
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.errors import Aborted, TimeLimitExceeded


def message(mid: str = "m1", token: str = "7") -> Message:
    return Message(mid, "q", None, 0, 0, 1, token)


class OnThread:
    """A handler thread's side of a slot, one step at a time: ``enter`` then ``leave``."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.steps: list[Any] = []
        self.done: list[Any] = []
        self.go = threading.Semaphore(0)
        self.stepped = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def do(self, step: Any) -> Any:
        self.steps.append(step)
        self.go.release()
        assert self.stepped.acquire(timeout=TIMEOUT)
        return self.done[-1]

    def _main(self) -> None:
        slot = self.runs.slot()
        while True:
            self.go.acquire()
            self.done.append(self.steps[-1](slot))
            self.stepped.release()


def test_an_unwatched_handler_has_no_run_until_an_abort_adopts_it() -> None:
    runs = Runs()
    t = OnThread(runs)
    m = message()
    slot = t.do(lambda s: (s.enter(m, "q", False), s)[1])
    assert runs.all() == [] and t.do(lambda s: current_run()) is None
    assert runs.unwatched() == [(slot, m)]
    run = runs.adopt(slot, m, 0.0)
    assert run is not None and run.thread_ident == t.thread.ident
    assert runs.all() == [run] and runs.unwatched() == []
    assert runs.adopt(slot, m, 0.0) is run  # once
    run.learn_abort("by staff", 0.0)
    assert t.do(lambda s: abort_requested())
    assert t.do(lambda s: m.aborted)
    assert m.aborted  # read on another thread too
    t.do(lambda s: handler_returned())
    assert not run.send(Aborted, "aborted")  # its handler's code is over: refused
    assert t.do(lambda s: s.exit()) is run
    assert runs.all() == [] and not t.do(lambda s: abort_requested())


def test_no_run_is_made_for_a_handler_that_has_returned() -> None:
    runs = Runs()
    t = OnThread(runs)
    m = message()
    slot = t.do(lambda s: (s.enter(m, "q", False), s)[1])
    (listed,) = runs.unwatched()  # the poller's view, before the handler returns
    t.do(lambda s: handler_returned())
    assert runs.adopt(*listed, 0.0) is None
    assert slot.run is None and runs.all() == []
    assert t.do(lambda s: s.exit()) is None


def test_an_abort_read_for_a_message_the_thread_no_longer_runs_makes_no_run() -> None:
    runs = Runs()
    t = OnThread(runs)
    first, second = message("m1", "1"), message("m2", "2")
    slot = t.do(lambda s: (s.enter(first, "q", False), s)[1])
    (listed,) = runs.unwatched()
    t.do(lambda s: (handler_returned(), s.exit()))
    t.do(lambda s: s.enter(second, "q", False))  # the same thread, the next message
    assert runs.adopt(*listed, 0.0) is None
    assert slot.run is None and runs.all() == []
    assert not t.do(lambda s: abort_requested())


def test_a_watched_handler_has_its_run_from_the_start() -> None:
    runs = Runs()
    t = OnThread(runs)
    m = message()
    slot = t.do(lambda s: (s.enter(m, "q", True), s)[1])
    (run,) = runs.all()
    assert slot.run is run and run.inside and runs.unwatched() == []
    assert runs.adopt(slot, m, 0.0) is run
    t.do(lambda s: handler_returned())
    assert not run.inside
    assert t.do(lambda s: s.exit()) is run and runs.all() == []


# --- inside a running consumer ----------------------------------------------------------------


def test_an_abort_reaches_one_running_handler_of_a_queue_without_limits(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue("plain", clock=SystemClock(), concurrency=2, abort_grace_seconds=600)
    assert q.settings.time_limit is None and q.settings.soft_time_limit is None
    q.schedule_many([{"payload": "job", "id": "a"}, {"payload": "job", "id": "b"}])
    both, go_on = threading.Barrier(3), threading.Event()
    seen: dict[str, bool] = {}

    def job(m: Message) -> None:
        both.wait(TIMEOUT)
        while not m.aborted and not go_on.is_set():
            threading.Event().wait(0.01)
        seen[m.id] = abort_requested()

    consumer = Consumer([q], job, idle_seconds=0.1)
    r = running(consumer)
    both.wait(TIMEOUT)  # both handlers run
    assert q.abort("a", "by staff").running
    wait_until(lambda: "a" in seen)
    go_on.set()
    wait_until(lambda: q.counts()["garbage"] == 1 and q.counts()["unack"] == 0)
    assert seen == {"a": True, "b": False}
    assert redis_client.hget(q.keys.reasons, "a") == b"aborted: by staff"
    r.stop()


def test_a_time_limit_set_live_stops_a_handler_already_running(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    """Decided: a limit set on a queue (its settings edited live) applies to its handlers
    already running, timed from their start, as to those that start after."""
    q = make_queue("edited", clock=SystemClock(), backoff_base=60, backoff_max=60)
    q.schedule("spin", id="m1")
    started, stopped = threading.Event(), []

    def spin(m: Message) -> None:
        started.set()
        try:
            while True:
                pass
        except TimeLimitExceeded as e:
            stopped.append(e)
            raise

    r = running(Consumer([q], spin, idle_seconds=0.1))
    assert started.wait(TIMEOUT)
    q.settings = dataclasses.replace(q.settings, time_limit=0.2)
    wait_until(lambda: q.counts()["retry"] == 1)
    assert redis_client.hget(q.keys.reasons, "m1") == b"time limit exceeded (0.2 s)"
    assert len(stopped) == 1
    r.stop()


# --- contexts copied from a handler thread (asgiref's async_to_sync, copy_context().run) -------


async def _asked_in_a_coroutine() -> tuple[bool, object, object]:
    return abort_requested(), stop_error(), current_run()


@pytest.mark.parametrize("watched", [False, True], ids=["adopted", "time-limited"])
def test_an_abort_is_seen_inside_async_to_sync_on_a_handler_thread(watched: bool) -> None:
    runs = Runs()
    t = OnThread(runs)
    m = message()
    slot = t.do(lambda s: (runs.enter(m, "q", watched), s)[1])
    assert t.do(lambda s: async_to_sync(_asked_in_a_coroutine)()) == (False, None, slot.run)
    run = slot.run if watched else runs.adopt(slot, m, 0.0)
    assert run is not None and run.learn_abort("by staff", 0.0)
    seen, error, found = t.do(lambda s: async_to_sync(_asked_in_a_coroutine)())
    assert seen is True and isinstance(error, Aborted) and found is run


def test_a_context_copied_during_an_earlier_message_sees_no_later_abort() -> None:
    runs = Runs()
    t = OnThread(runs)
    first, second = message("m1", "7"), message("m2", "8")
    t.do(lambda s: runs.enter(first, "q", False))
    copied = t.do(lambda s: contextvars.copy_context())  # kept by a thread of the user's
    on_other_thread: list[tuple[bool, object]] = []

    def ask() -> None:
        on_other_thread.append(copied.run(lambda: (abort_requested(), current_run())))

    def in_a_thread(fn: Callable[[], None]) -> None:
        thread = threading.Thread(target=fn)
        thread.start()
        thread.join(TIMEOUT)

    in_a_thread(ask)  # during its message: nothing aborted
    t.do(lambda s: s.exit())
    slot = t.do(lambda s: runs.enter(second, "q", False))
    run = runs.adopt(slot, second, 0.0)
    assert run is not None and run.learn_abort("the second one", 0.0)
    in_a_thread(ask)
    # A copy made during the second message sees it.
    fresh = t.do(lambda s: contextvars.copy_context())
    seen_fresh: list[bool] = []
    in_a_thread(lambda: seen_fresh.append(fresh.run(abort_requested)))
    assert on_other_thread == [(False, None), (False, None)]
    assert seen_fresh == [True]
