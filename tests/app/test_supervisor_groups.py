"""supervisor/groups.py: a consumer process's group dies with it, whoever kills it.

Real processes: a program that does what a supervised child does (leads its group, starts the
guard) and starts ``sleep 60`` as a handler would; it is then killed with SIGKILL, as a
``kill -9`` of its supervisor kills it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import child_pythonpath

from django_delayqueue.supervisor.groups import kill_group

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

LEADER = """
import subprocess, sys, time
from django_delayqueue.supervisor.groups import guard_group, lead_group
lead_group()
guard = guard_group() if sys.argv[1] == "guard" else None
program = subprocess.Popen(["sleep", "60"])
print(guard, program.pid, flush=True)
time.sleep(60)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie: killed, its parent gone, not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pids: list[int], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _leader(mode: str) -> tuple[subprocess.Popen[str], int | None, int]:
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER, mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
    )
    assert leader.stdout is not None
    guard, program = leader.stdout.readline().split()
    if guard != "None":  # named once it ignores the stop signals and waits for its own
        deadline = time.monotonic() + 30
        while Path(f"/proc/{guard}/comm").read_text().strip() != "dq-group-guard":
            assert time.monotonic() < deadline, "the guard never took its name"
            time.sleep(0.01)
    return leader, None if guard == "None" else int(guard), int(program)


def test_the_guard_kills_the_group_once_its_leader_is_killed() -> None:
    leader, guard, program = _leader("guard")
    try:
        assert guard is not None and _running(guard) and _running(program)
        assert os.getpgid(program) == os.getpgid(guard) == leader.pid  # one group, its own
        assert Path(f"/proc/{guard}/comm").read_text().strip() == "dq-group-guard"
        leader.kill()  # SIGKILL: nothing of the leader runs
        leader.wait(30)
        assert _gone([program, guard]), "the program outlived its group's leader"
    finally:
        kill_group(leader.pid)
        leader.kill()
        leader.wait()


def test_the_guard_ignores_the_signals_a_stop_sends_to_every_process() -> None:
    """systemd's KillMode=control-group sends SIGTERM to each process: the guard stays until
    its leader is gone."""
    leader, guard, program = _leader("guard")
    try:
        assert guard is not None
        os.kill(guard, signal.SIGTERM)
        os.kill(guard, signal.SIGHUP)
        time.sleep(0.2)
        assert _running(guard) and _running(program)
    finally:
        leader.kill()
        leader.wait()
    assert _gone([program, guard])


def _pending_signals(pid: int) -> int:
    """The signals sent to ``pid`` that it has not taken yet (thread and process pending)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


def test_the_guard_s_own_signal_from_someone_else_kills_nothing() -> None:
    """A `pkill -USR2 -f runqueue` (to dump stacks) reaches the guard too: only its leader's
    death (the parent-death signal, once the kernel reparented the guard) ends the group."""
    leader, guard, program = _leader("guard")
    try:
        assert guard is not None
        os.kill(guard, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while _pending_signals(guard):  # until the guard has taken it (sigwait)
            assert time.monotonic() < deadline, "the guard never took the signal"
            time.sleep(0.01)
        assert leader.poll() is None and _running(program) and _running(guard)
    finally:
        leader.kill()
        leader.wait()
    assert _gone([program, guard])


def test_kill_group_kills_what_the_leader_left_behind() -> None:
    """What the supervisor does once it has reaped a consumer process."""
    leader, _, program = _leader("alone")
    leader.kill()
    leader.wait(30)
    assert _running(program)  # no guard: left behind, re-parented
    assert kill_group(leader.pid)  # the group outlives its leader while a member lives
    assert _gone([program])


HEAVY_LEADER = """
import sys
from django_delayqueue.supervisor.groups import guard_group, lead_group
lead_group()
heap = [str(i) * 8 for i in range(1_000_000)]  # a consumer process's heap (Django, its apps)
guard = guard_group()
for i in range(len(heap)):  # it goes on: each page it writes is copied, the old one the guard's
    heap[i] += "!"
print(guard, flush=True)
sys.stdin.read()  # until the test is done
"""


def _private_bytes(pid: int) -> int:
    """The memory ``pid`` holds alone (shared with no other process)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields["Private_Clean"] + fields["Private_Dirty"]


def test_the_guard_holds_no_copy_of_its_leader_s_memory() -> None:
    """Before: the guard was a fork of the consumer process, and came to own every page its
    leader wrote over since (24 to 110 MB per consumer process, measured): now a small
    program of its own."""
    leader = subprocess.Popen(
        [sys.executable, "-c", HEAVY_LEADER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
    )
    assert leader.stdout is not None and leader.stdin is not None
    try:
        guard = int(leader.stdout.readline())
        deadline = time.monotonic() + 30
        while Path(f"/proc/{guard}/comm").read_text().strip() != "dq-group-guard":
            assert time.monotonic() < deadline, "the guard never took its name"
            time.sleep(0.01)
        mb = 1024 * 1024
        assert _private_bytes(leader.pid) > 60 * mb  # the heap it wrote over
        assert _private_bytes(guard) < 20 * mb, "the guard holds a copy of its leader's heap"
    finally:
        leader.kill()
        leader.wait()
    assert _gone([guard])
