"""django_delayqueue.dispatch: a signal's sync and async receivers, and sending to both from the
event loop as Django's ``Signal.asend_robust`` does (on every supported Django)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.dispatch import Signal

from django_delayqueue.dispatch import (
    asend_robust,
    has_async_receivers,
    in_thread_to_its_end,
    split_receivers,
)


def sync_one(**kwargs: Any) -> str:
    return "sync one"


def sync_fails(**kwargs: Any) -> None:
    raise ValueError("sync fails")


async def async_one(**kwargs: Any) -> str:
    await asyncio.sleep(0)
    return "async one"


async def async_fails(**kwargs: Any) -> None:
    raise ValueError("async fails")


def test_split_and_has_async_receivers() -> None:
    signal = Signal()
    assert split_receivers(signal, "q") == ([], [])
    assert not has_async_receivers(signal, "q")
    signal.connect(sync_one)
    assert not has_async_receivers(signal, "q")
    signal.connect(async_one)
    signal.connect(async_fails, sender="another queue")
    assert split_receivers(signal, "q") == ([sync_one], [async_one])
    assert has_async_receivers(signal, "q")
    signal.disconnect(async_one)
    assert not has_async_receivers(signal, "q")
    assert has_async_receivers(signal, "another queue")


def test_asend_robust_runs_both_kinds_and_returns_errors_as_responses() -> None:
    signal = Signal()
    for receiver in (async_fails, sync_one, async_one, sync_fails):
        signal.connect(receiver)
    responses = asyncio.run(asend_robust(signal, "q", message="m"))
    # Sync receivers' responses first, each kind in the order of connection (as Django's).
    assert [r for r, _ in responses] == [sync_one, sync_fails, async_fails, async_one]
    by_receiver = dict(responses)
    assert by_receiver[sync_one] == "sync one"
    assert by_receiver[async_one] == "async one"
    assert str(by_receiver[sync_fails]) == "sync fails"
    assert str(by_receiver[async_fails]) == "async fails"


def test_a_base_exception_of_a_receiver_fails_the_send() -> None:
    signal = Signal()

    async def interrupted(**kwargs: Any) -> None:
        raise KeyboardInterrupt("stop")

    signal.connect(interrupted)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(asend_robust(signal, "q"))


def test_a_cancelled_coroutine_waits_for_its_thread_to_end() -> None:
    entered, release = threading.Event(), threading.Event()
    ended: list[str] = []

    def blocking() -> str:
        entered.set()
        release.wait(20)
        ended.append("thread")
        return "done"

    async def main() -> None:
        task = asyncio.ensure_future(in_thread_to_its_end(blocking))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 20)
        task.cancel("time limit")
        await asyncio.sleep(0.05)
        assert not task.done()  # cancelled, yet waiting for what its thread runs
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        ended.append("coroutine")

    asyncio.run(main())
    assert ended == ["thread", "coroutine"]
