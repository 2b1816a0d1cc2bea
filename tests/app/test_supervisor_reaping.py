"""What the supervisor loop makes of a consumer process it reaps (supervisor/loop.py ``_gone``):
the messages it left are settled once each, and a fresh interpreter (after SIGHUP) that died
before it consumed is a failed deploy only when its start failed on its own.

The children here are real processes that already exited (``true``, or ``sleep`` killed),
with a real pipe for what they said; Redis is never reached (``settle`` and the start-failure
records are replaced).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.supervisor import loop
from django_delayqueue.supervisor.children import Child, SupervisorOptions
from django_delayqueue.supervisor.liveness import Held
from django_delayqueue.supervisor.loop import Supervisor
from django_delayqueue.supervisor.protocol import ALIVE, STOPPED, LineReader

pytestmark = pytest.mark.skipif(not hasattr(os, "waitstatus_to_exitcode"), reason="POSIX")


class NoRecords:
    """Stands for supervisor.start_failures (which writes to Redis)."""

    def __init__(self) -> None:
        self.deaths: list[tuple[int, bool, str]] = []

    def died(self, slot: int, consumed: bool, error: str) -> None:
        self.deaths.append((slot, consumed, error))

    def failed(self, error: str, details: str | None) -> None:
        pass

    def consumed(self, slot: int) -> None:
        pass

    def stopped(self) -> None:
        pass


@pytest.fixture
def supervisor(monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    settled: list[list[StoppedHandler]] = []

    def keep(stopped: list[StoppedHandler], *, final: bool = False) -> list[StoppedHandler]:
        settled.append(list(stopped))
        return []

    monkeypatch.setattr(loop, "settle", keep)
    monkeypatch.setattr(loop, "close_connections", lambda: None)
    sup = Supervisor(SupervisorOptions(queues=["order-close"], processes=1))
    sup.start_failures = NoRecords()  # type: ignore[assignment]
    sup._fill_slots = lambda: None  # type: ignore[method-assign]  # nothing forked here
    sup.settled = settled  # type: ignore[attr-defined]
    yield sup


def _exited(argv: list[str], kill: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """A process that has ended (killed with SIGKILL if ``kill``), and its wait status."""
    process = subprocess.Popen(argv, start_new_session=True)
    if kill:
        process.kill()
    _, status = os.waitpid(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process, status


def _child(process: subprocess.Popen[bytes], *, fresh: bool) -> tuple[Child, int]:
    """A Child for ``process``; the write end of its pipe (the caller closes it)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    child = Child(
        0,
        process.pid,
        "x.1",
        LineReader(read_fd),
        time.monotonic(),
        process=process if fresh else None,
    )
    return child, write_fd


def _say(fd: int, kind: str, **fields: Any) -> None:
    os.write(fd, (json.dumps({"kind": kind, **fields}) + "\n").encode())


def test_a_stopped_report_read_only_as_its_silent_process_is_reaped_is_settled_once(
    supervisor: Supervisor,
) -> None:
    """A process killed for its silence wrote its STOPPED report just before (or its beats
    were read first): before, the message was noted from its last beat and from the report,
    and nacked twice (the second time "left alone", a log line that says it came back)."""
    process, status = _exited(["sleep", "60"], kill=True)
    child, write_fd = _child(process, fresh=False)
    supervisor.slots[0].current = child
    held = Held("order-close", "m1", "7", 1, abort="by staff", time_limit=2.0, limit_in=-1.0)
    _say(write_fd, ALIVE, within=2.0, running=[held.to_json()])
    for message in child.reader.read():
        supervisor._on_message(child, message)
    child.answer_by = time.monotonic() - 1  # silent past what its beat asked for
    supervisor._kill_silent()
    assert child.killed and child.silent is not None
    reported = StoppedHandler("order-close", "m1", "7", 1, "dead", "aborted: by staff")
    _say(write_fd, STOPPED, handlers=[reported.to_json()])  # read only as it is reaped
    os.close(write_fd)
    supervisor._gone(child, status)
    assert supervisor.settled == [[reported]]  # type: ignore[attr-defined]
    assert supervisor.slots[0].current is None and supervisor.slots[0].stuck


def test_a_report_and_a_beat_of_the_same_delivery_are_one_message_to_settle() -> None:
    process, _ = _exited(["true"])
    child, write_fd = _child(process, fresh=False)
    os.close(write_fd)
    guessed = StoppedHandler("q", "m1", "7", 1, "retry", "its consumer process stopped")
    reported = StoppedHandler("q", "m1", "7", 1, "retry", "time limit exceeded (2 s)")
    other = StoppedHandler("q", "m2", "8", 1, "retry", "time limit exceeded (2 s)")
    child.note_stopped([guessed], reported=False)
    child.note_stopped([reported, other], reported=True)
    child.note_stopped([guessed], reported=False)  # a later guess never replaces a report
    child.note_stopped([reported], reported=True)
    assert child.stopped == [reported, other]
    child.reader.close()


@pytest.mark.parametrize(
    ("killed_by", "failed_deploy"),
    [("its supervisor", False), ("someone else", False), ("its own start", True)],
)
def test_a_fresh_interpreter_that_died_before_it_consumed_is_a_failed_deploy_only_on_its_own(
    supervisor: Supervisor, killed_by: str, failed_deploy: bool
) -> None:
    """Before: one the supervisor killed (for its silence) before it said ready was taken for
    a failed deploy: the slot's next replacement of a stuck process was a fork of the old
    code ("no fresh interpreter can start"), whose code on disk loaded fine."""
    supervisor.fresh_children = True
    if killed_by == "its own start":  # an ImportError in django.setup(): exit code 1
        process, status = _exited([sys.executable, "-c", "raise SystemExit(1)"])
    else:
        process, status = _exited(["sleep", "60"], kill=True)
    child, write_fd = _child(process, fresh=True)
    os.close(write_fd)
    child.killed = killed_by == "its supervisor"
    if child.killed:
        child.silent = 12.0
    slot = supervisor.slots[0]
    slot.current = child
    supervisor._gone(child, status)
    assert (slot.fresh_failed is not None) is failed_deploy, slot.fresh_failed
    if failed_deploy:
        assert slot.fresh_failed == "exit code 1"
