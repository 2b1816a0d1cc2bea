"""supervisor/memory.py: when a child asks to be recycled (once), the least a consumer process
weighs (a --max-memory-per-child below it is refused), and the supervisor's pace when processes
outgrow their limit right after their start."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from django_delayqueue.core.consumer.rounds.details import rss_bytes
from django_delayqueue.supervisor import loop
from django_delayqueue.supervisor.children import Child, Slot, SupervisorOptions
from django_delayqueue.supervisor.loop import Supervisor
from django_delayqueue.supervisor.memory import (
    MEMORY_CHECK_SECONDS,
    RecyclePolicy,
    memory_limit_problem,
    own_memory_bytes,
)
from django_delayqueue.supervisor.protocol import READY, RECYCLE, LineReader


def test_by_message_count_once() -> None:
    policy = RecyclePolicy(max_messages=3)
    assert policy.reason(2) is None
    assert "--max-messages-per-child 3" in (policy.reason(3) or "")
    assert not policy.for_memory
    assert policy.reason(10) is None  # asked already: the supervisor is replacing it


def test_by_resident_memory_read_at_most_once_a_second() -> None:
    now = [100.0]
    reads: list[int] = []
    rss = [50 * 1024**2]

    def read() -> int:
        reads.append(1)
        return rss[0]

    policy = RecyclePolicy(max_memory_mb=100, read_rss=read, monotonic=lambda: now[0])
    assert policy.reason(0) is None
    rss[0] = 150 * 1024**2
    assert policy.reason(0) is None and len(reads) == 1  # not read again within the second
    now[0] += MEMORY_CHECK_SECONDS
    assert policy.reason(0) == "resident memory 150 MB (--max-memory-per-child 100)"
    assert policy.for_memory  # said to the supervisor, which paces such replacements


def test_nothing_asked_without_limits() -> None:
    assert RecyclePolicy().reason(10**9) is None


def test_this_process_has_a_resident_size() -> None:
    assert (rss_bytes() or 0) > 1024**2


# --- a limit below what a consumer process starts with ---------------------------------------


def test_own_memory_is_what_a_forked_child_holds_at_least() -> None:
    own = own_memory_bytes()
    assert own is not None and 1024**2 < own <= (rss_bytes() or 0)


def test_a_limit_at_or_below_the_own_memory_is_refused_with_the_figures() -> None:
    own = 48 * 1024**2
    said = memory_limit_problem(20, own) or ""
    assert said.startswith("--max-memory-per-child 20 is below the memory every consumer ")
    assert "this runqueue holds 48 MB of its own after setup" in said
    assert "Give more than 48 MB" in said
    assert memory_limit_problem(48, own) is not None
    assert memory_limit_problem(49, own) is None
    assert memory_limit_problem(20, None) is None  # not known (no /proc): nothing refused


# --- a process that asks for memory right after its start: paced, never a fork storm ---------


class FakeStarter:
    """Stands for the fork (the loop's decisions are under test here; the drill
    test_faults_supervisor.py starts real processes)."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def start(self, slot: Slot, *, fresh: bool, open_fds: Sequence[int]) -> Child:
        child = Child(
            slot.index, 10_000 + len(self.started), "c", LineReader(-1), loop.time.monotonic()
        )
        self.started.append(child)
        return child


@pytest.fixture
def paced(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Supervisor, FakeStarter, list[float]]]:
    now = [1000.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(loop, "send_signal", lambda child, signum: None)
    supervisor = Supervisor(SupervisorOptions(max_memory_per_child_mb=50))
    starter = FakeStarter()
    supervisor.starter = starter  # type: ignore[assignment]
    supervisor._fill_slots()
    yield supervisor, starter, now


def _serve_then_outgrow(supervisor: Supervisor, child: Child, *, memory: bool = True) -> None:
    supervisor._on_message(child, {"kind": READY})
    supervisor._on_message(child, {"kind": RECYCLE, "reason": "resident memory", "memory": memory})


def test_memory_recycling_right_after_start_is_paced_as_a_crash_loop(
    paced: tuple[Supervisor, FakeStarter, list[float]], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37: a limit below a fresh process's size had the supervisor start 215-250
    processes in 10 s, each replaced as soon as it said it consumed. The first is replaced
    at once; from the second on, 0.5 s doubling (the process serves meanwhile)."""
    supervisor, starter, now = paced
    slot = supervisor.slots[0]
    waits = []
    for _ in range(6):
        child = starter.started[-1]
        now[0] += 0.2  # asks 0.2 s after its start
        _serve_then_outgrow(supervisor, child)
        supervisor._fill_slots()
        if slot.successor is None:  # not at once: when, and the old one serves until then
            assert slot.current is child
            waits.append(round(slot.not_before - now[0], 3))
            now[0] = slot.not_before
            supervisor._fill_slots()
        else:
            waits.append(0.0)
        assert slot.successor is starter.started[-1] and len(starter.started) == len(waits) + 1
        supervisor._on_message(slot.successor, {"kind": READY})  # it consumes: the old stops
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
    assert "outgrew --max-memory-per-child 0.2s after its start" in caplog.text


def test_a_process_that_outgrew_its_limit_late_is_replaced_at_once(
    paced: tuple[Supervisor, FakeStarter, list[float]],
) -> None:
    supervisor, starter, now = paced
    slot = supervisor.slots[0]
    for _ in range(4):  # a leak that takes a minute each time: never paced
        child = starter.started[-1]
        now[0] += 60
        _serve_then_outgrow(supervisor, child)
        supervisor._fill_slots()
        assert slot.successor is starter.started[-1] is not child
        supervisor._on_message(slot.successor, {"kind": READY})


def test_recycling_by_message_count_is_never_paced(
    paced: tuple[Supervisor, FakeStarter, list[float]],
) -> None:
    supervisor, starter, now = paced
    slot = supervisor.slots[0]
    for _ in range(4):  # --max-messages-per-child on a busy queue: what the user asked for
        child = starter.started[-1]
        now[0] += 0.2
        _serve_then_outgrow(supervisor, child, memory=False)
        supervisor._fill_slots()
        assert slot.successor is starter.started[-1] is not child
        supervisor._on_message(slot.successor, {"kind": READY})
