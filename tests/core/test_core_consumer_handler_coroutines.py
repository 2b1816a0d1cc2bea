"""``async def`` handlers on the consumer's event loop (core/consumer/handlers/coroutines.py and
the modules beside it: coroutine_context.py, loop_liveness.py, interruptible.py),
with a real Redis and a real Consumer: concurrency without threads, outcomes, time limits,
cancelling, stopping."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
import redis
from core_consumer_support import EMPTY, burst
from waiting import TIMEOUT, wait_until

from django_delayqueue.core import Message, Reject, Retry
from django_delayqueue.core.clock import SystemClock
from django_delayqueue.core.consumer.handlers import coroutines as handler_coroutines
from django_delayqueue.core.consumer.handlers.coroutine_context import sync_part
from django_delayqueue.core.consumer.handlers.interruptible import Interruptible
from django_delayqueue.core.consumer.limits.stopped import StoppedHandler, time_limit_reason
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.errors import SoftTimeLimitExceeded


def handler_threads(queue: str = "q") -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"delayqueue-{queue}-")]


class Crowd:
    """Coroutines that each wait until ``size`` of them wait at once, on one asyncio.Event."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.waiting = 0
        self.threads: set[int] = set()
        self.event: asyncio.Event | None = None

    async def __call__(self, message: Message) -> None:
        self.threads.add(threading.get_ident())
        if self.event is None:
            self.event = asyncio.Event()  # made on the loop that runs every handler
        self.waiting += 1
        if self.waiting == self.size:
            self.event.set()
        await asyncio.wait_for(self.event.wait(), TIMEOUT)


# --- concurrency ----------------------------------------------------------------------------------


def test_200_coroutines_run_at_once_on_one_loop_thread(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock(), concurrency=200)
    crowd = Crowd(200)
    seen_running: list[int] = []
    seen_threads: list[int] = []

    consumer = Consumer([q], crowd, idle_seconds=0.1)
    running(consumer)
    wait_until(lambda: handler_threads())  # the one thread a queue keeps
    q.schedule_many([{"payload": i} for i in range(200)])

    def all_waiting() -> bool:
        seen_running.append(len(consumer.running_handlers()))
        seen_threads.append(len(handler_threads()))
        return crowd.waiting == 200 or (crowd.event is not None and crowd.event.is_set())

    wait_until(all_waiting)
    wait_until(lambda: q.counts() == EMPTY)
    # Each waited for all 200 to wait: they ran at once, every one on the same thread, and the
    # queue's threads did not follow its concurrency of 200.
    assert crowd.waiting == 200
    assert len(crowd.threads) == 1
    assert crowd.threads == {consumer.coroutines.thread_ident}
    assert max(seen_threads) == 1
    assert consumer.delivered == 200


def test_running_coroutines_are_listed_as_running_handlers(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock(), concurrency=5)
    release = threading.Event()

    async def handler(message: Message) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    q.schedule_many([{"payload": i} for i in range(3)])
    listed = wait_until(
        lambda: len(consumer.running_handlers()) == 3 and consumer.running_handlers()
    )
    assert all(r.coroutine for r in listed)
    assert {r.thread_ident for r in listed} == {consumer.coroutines.thread_ident}
    assert sorted(r.message.payload for r in listed) == [0, 1, 2]
    release.set()
    wait_until(lambda: q.counts() == EMPTY)
    assert consumer.running_handlers() == []


def test_concurrency_bounds_the_coroutines_running_at_once(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock(), concurrency=3)
    state = {"now": 0, "most": 0}
    release = threading.Event()

    async def handler(message: Message) -> None:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        while not release.is_set():
            await asyncio.sleep(0.01)
        state["now"] -= 1

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    q.schedule_many([{"payload": i} for i in range(10)])
    wait_until(lambda: state["now"] == 3)
    assert q.counts()["ready"] >= 7 - 3  # what a thread of room claims, not all ten
    release.set()
    wait_until(lambda: q.counts() == EMPTY)
    assert state["most"] == 3
    assert consumer.delivered == 10


# --- outcomes -------------------------------------------------------------------------------------


def test_outcomes_of_coroutines(redis_client: redis.Redis, make_queue: Any) -> None:
    q = make_queue(max_attempts=5, concurrency=4)
    for name in ("ok", "boom", "base", "retry", "reject", "cancelled"):
        q.schedule(name, id=name)

    async def handler(message: Message) -> str:
        await asyncio.sleep(0)
        kind = message.payload
        if kind == "boom":
            raise ValueError("boom")
        if kind == "base":
            raise KeyboardInterrupt("not the loop's")
        if kind == "retry":
            raise Retry(delay=7.5, reason="not yet")
        if kind == "reject":
            raise Reject("never")
        if kind == "cancelled":
            raise asyncio.CancelledError("from inside")
        return "done"

    consumer = burst([q], handler)
    assert consumer.delivered == 6
    assert q.counts() == {**EMPTY, "retry": 4, "garbage": 1}
    reasons = {k.decode(): v.decode() for k, v in redis_client.hgetall(q.keys.reasons).items()}
    assert reasons["boom"] == "ValueError: boom"
    assert reasons["base"].startswith("KeyboardInterrupt")
    assert reasons["retry"] == "not yet"
    assert reasons["reject"] == "never"
    assert reasons["cancelled"].startswith("CancelledError")
    assert redis_client.zscore(q.keys.retry, "retry") == q.clock.now_ms() + 7_500


def test_a_queue_with_sync_and_async_handlers(make_queue: Any) -> None:
    q = make_queue(concurrency=2)
    q.schedule_many([{"payload": {"kind": k, "n": i}} for i in range(5) for k in ("sync", "async")])
    ran: list[tuple[str, bool]] = []
    loop_thread: set[int] = set()

    class Mixed(Consumer):
        def runs_async(self, message: Message) -> bool:
            return bool(message.payload["kind"] == "async")

        def handle(self, message: Message) -> None:
            ran.append(("sync", threading.get_ident() == self.coroutines.thread_ident))

        async def ahandle(self, message: Message) -> None:
            await asyncio.sleep(0)
            loop_thread.add(threading.get_ident())
            ran.append(("async", threading.get_ident() == self.coroutines.thread_ident))

    consumer = Mixed([q], burst=True)
    assert consumer.run() == 0
    assert q.counts() == EMPTY
    assert sorted(ran) == [("async", True)] * 5 + [("sync", False)] * 5
    assert len(loop_thread) == 1


def test_a_coroutine_never_starts_before_its_due_time(make_queue: Any, running: Any) -> None:
    clock = SystemClock()
    q = make_queue(clock=clock, concurrency=20)
    started: dict[int, tuple[int, int]] = {}

    async def handler(message: Message) -> None:
        started[message.payload] = (clock.now_ms(), message.due_ms)

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    now = clock.now_ms()
    q.schedule_many([{"payload": i, "delay": 0.05 + i * 0.013} for i in range(20)])
    wait_until(lambda: len(started) == 20)
    assert all(at >= due for at, due in started.values())
    assert now > 0


# --- time limits, cancelling ----------------------------------------------------------------------


def test_a_coroutine_past_its_time_limit_is_cancelled_and_retried(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue(clock=SystemClock(), concurrency=2, time_limit=0.3, backoff_base=60)
    seen: list[str] = []

    async def handler(message: Message) -> None:
        if message.payload == "slow":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    q.schedule("slow", id="slow")
    wait_until(lambda: q.counts()["retry"] == 1)
    assert seen == ["cancelled"]
    reason = redis_client.hget(q.keys.reasons, "slow")
    assert reason is not None and reason.decode() == time_limit_reason(0.3)
    assert redis_client.hget(q.keys.attempts, "slow") == b"1"  # the attempt counted
    q.schedule("fast", id="fast")  # the slot is back in service
    wait_until(lambda: q.counts() == {**EMPTY, "retry": 1})


def test_the_soft_limit_raises_inside_the_coroutine(make_queue: Any, running: Any) -> None:
    q = make_queue(clock=SystemClock(), soft_time_limit=0.2, time_limit=30)
    seen: list[str] = []

    async def handler(message: Message) -> str:
        try:
            await asyncio.sleep(3600)
        except SoftTimeLimitExceeded as e:
            seen.append(str(e))
            await asyncio.sleep(0.01)  # cleaning up still awaits
            return "cleaned up"
        return "never"

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    q.schedule("x")
    wait_until(lambda: consumer.delivered == 1)
    # Returned after the soft limit: acknowledged as usual (recorded by the next round trip).
    wait_until(lambda: q.counts() == EMPTY)
    assert seen == ["soft time limit exceeded (0.2 s)"]


def test_cancel_sends_a_running_coroutine_to_the_dead_letters(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    q = make_queue(clock=SystemClock())

    async def handler(message: Message) -> None:
        await asyncio.sleep(3600)

    consumer = Consumer([q], handler, idle_seconds=0.1)
    running(consumer)
    q.schedule("x", id="x")
    handler_running = wait_until(lambda: consumer.running_handlers())
    token = handler_running[0].message.token
    assert not consumer.coroutines.cancel("q", "no such token", "aborted: test")
    assert consumer.coroutines.cancel("q", token, "aborted: by staff", "dead")
    assert not consumer.coroutines.cancel("q", token, "aborted: twice", "dead")
    wait_until(lambda: q.counts()["garbage"] == 1)
    assert redis_client.hget(q.keys.reasons, "x") == b"aborted: by staff"


class Replaced(Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replacements: list[list[StoppedHandler]] = []

    def replacement_needed(self, stopped: list[StoppedHandler]) -> None:
        self.replacements.append(stopped)


@pytest.mark.parametrize("how", ["swallows CancelledError", "blocks the loop"])
def test_a_coroutine_that_cannot_be_stopped_gets_its_process_replaced(
    make_queue: Any, running: Any, how: str, monkeypatch: Any
) -> None:
    # When it is reported (its Run's stop wait), and how long close waits.
    monkeypatch.setattr(handler_coroutines, "STOP_WAIT_SECONDS", 0.2)
    q = make_queue(clock=SystemClock(), concurrency=2, time_limit=0.2)
    release = threading.Event()

    async def handler(message: Message) -> None:
        if how == "blocks the loop":
            release.wait(TIMEOUT)  # sync code on the loop: no cancel can reach it
            return
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    consumer = Replaced([q], handler, idle_seconds=0.1, grace_seconds=0.2)
    r = running(consumer)
    q.schedule("stuck", id="stuck")
    wait_until(lambda: consumer.replacements)
    [stopped] = consumer.replacements
    assert [(s.message_id, s.settlement, s.reason) for s in stopped] == [
        ("stuck", "retry", time_limit_reason(0.2))
    ]
    r.thread.join(TIMEOUT)  # the consumer stopped as on SIGTERM
    assert not r.thread.is_alive()
    assert q.counts()["unack"] == 1  # left in flight, for the supervisor to settle
    release.set()
    # Once the loop is gone, nothing of it can run again: no longer extended (it comes back
    # after its visibility timeout), the loop thread ended.
    wait_until(lambda: not consumer._abandoned("q"))
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "delayqueue-event-loop"])


# --- stopping -------------------------------------------------------------------------------------


def test_a_stop_lets_coroutines_finish_then_cancels_them_leaving_them_in_flight(
    make_queue: Any, running: Any
) -> None:
    q = make_queue(clock=SystemClock(), concurrency=4, visibility_timeout=60)
    ends: list[str] = []

    async def handler(message: Message) -> None:
        if message.payload == "quick":
            await asyncio.sleep(0.3)
            ends.append("quick done")
            return
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ends.append("slow cancelled")
            raise

    consumer = Consumer([q], handler, idle_seconds=0.1, grace_seconds=1.0)
    r = running(consumer)
    q.schedule("quick", id="quick")
    q.schedule("slow", id="slow")
    wait_until(lambda: len(consumer.running_handlers()) == 2)
    consumer.request_stop()
    assert r.join() == 0
    assert sorted(ends) == ["quick done", "slow cancelled"]
    # The one that finished in the grace period was acknowledged; the cancelled one stays in
    # flight (comes back after its visibility timeout, as a thread's does), never run twice.
    assert q.counts() == {**EMPTY, "unack": 1}
    assert [m.id for m in q.peek("unack").messages] == ["slow"]
    assert not [t for t in threading.enumerate() if t.name.startswith("delayqueue-event-loop")]


def test_the_interruptible_passes_values_and_errors_through() -> None:
    async def inner() -> int:
        await asyncio.sleep(0)
        try:
            await asyncio.sleep(0.01)
        except ValueError:
            return -1
        return 42

    async def main() -> tuple[int, int]:
        plain = await Interruptible(inner())
        body = Interruptible(inner())
        task = asyncio.ensure_future(_await(body))
        await asyncio.sleep(0.001)
        assert body.interrupt(ValueError("x"))
        interrupted = await task
        assert not task.cancelled()
        return plain, interrupted

    assert asyncio.run(main()) == (42, -1)


async def _await(body: Interruptible) -> Any:
    return await body


def test_run_ends_the_event_loop_thread(make_queue: Any) -> None:
    q = make_queue(concurrency=3)
    q.schedule_many([{"payload": i} for i in range(6)])

    async def handler(message: Message) -> None:
        await asyncio.sleep(0)

    before = time.monotonic()
    burst([q], handler)
    assert time.monotonic() >= before
    assert not [t for t in threading.enumerate() if t.name.startswith("delayqueue-event-loop")]


def test_a_coroutine_cancelled_at_once_still_ends_as_its_canceller_says() -> None:
    # Cancelled before the loop ran a step of it (a stop, an abort right after the claim), its
    # task never runs a line: its outcome must come all the same, or its slot is lost.
    class Deliverer:
        def runs_async(self, message: Message) -> bool:
            return True

        def time_limits(self, message: Message) -> tuple[float | None, float | None]:
            return None, None

        async def adeliver(self, message: Message) -> Any:
            await asyncio.sleep(3600)

    outcomes: list[Any] = []
    ended = threading.Event()
    runner = handler_coroutines.HandlerCoroutines(Deliverer())
    try:
        for token in ("1", "2", "3"):
            message = Message(f"m{token}", "q", None, 0, 0, 1, token)
            runner.start(
                message, lambda o: (outcomes.append(o), len(outcomes) == 3 and ended.set())
            )
            assert runner.cancel("q", token, "aborted: at once", "dead")
        assert ended.wait(TIMEOUT)
    finally:
        runner.close()
    assert sorted(o.message.id for o in outcomes) == ["m1", "m2", "m3"]
    assert {(o.status, o.reason) for o in outcomes} == {("garbage", "aborted: at once")}
    assert runner.tokens() == []


def test_a_coroutine_dropped_while_its_sync_part_runs_stays_extended_until_that_ends(
    redis_client: redis.Redis, make_queue: Any, running: Any
) -> None:
    # Its sync part (sync_part: what dispatch.in_thread_to_its_end runs on a thread) outlives
    # the loop that a stop closed; the process lives on (a library run): its message must stay
    # given up on and extended until that code ended, never delivered again beside it.
    q = make_queue(clock=SystemClock(), visibility_timeout=1)
    in_sync, release = threading.Event(), threading.Event()

    def sync_code() -> None:
        in_sync.set()
        release.wait(TIMEOUT)

    async def handler(message: Message) -> None:
        future = asyncio.get_running_loop().run_in_executor(None, sync_part(sync_code))
        while not future.done():  # as in_thread_to_its_end: cancelled, it waits on
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(future)

    consumer = Consumer([q], handler, idle_seconds=0.1, grace_seconds=0.2)
    r = running(consumer)
    q.schedule("x", id="held")
    try:
        assert in_sync.wait(TIMEOUT)
        consumer.request_stop()
        r.join()
        assert not [t for t in threading.enumerate() if t.name == "delayqueue-event-loop"]
        first = redis_client.zscore(q.keys.unack, "held")
        assert first is not None
        # Extended on, past the deadline it had when the loop was gone.
        wait_until(lambda: (redis_client.zscore(q.keys.unack, "held") or 0) > first)
    finally:
        release.set()
    # Its sync part ended: released, no longer extended (this consumer's extender's linger
    # ends; another test's consumer in this process may have one of its own).
    wait_until(lambda: not consumer._extender._thread.is_alive())
    assert q.counts() == {**EMPTY, "unack": 1}
