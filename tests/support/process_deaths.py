"""When each process a drill cares about ended, to the millisecond, whoever its parent is.

A handler call whose process died has no end line in the ledger: it ran until its process
ended, and a run of the same message that started after that instant did not run beside it. A
:class:`DeathWatch` learns each pid from the places a drill names (the children of its
supervisors, the ledger's start lines and the programs handlers ran) and opens a pidfd on it
(Linux 5.3+): the pidfd turns readable as the process exits, so its wall time is read then,
not at the next poll of ``/proc``. That works for processes that are not the test's children,
and for orphans re-parented to pid 1.

A process already gone when it was first seen gets the time it was seen as its end (an upper
bound): :attr:`DeathWatch.late` names those.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def wall_ms() -> int:
    return int(time.time() * 1000)


def children_of(pid: int) -> set[int]:
    """The processes ``pid`` started that are still its children (every thread's, Linux)."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            found |= {int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()}
        except OSError:
            continue
    return found


class DeathWatch:
    """A thread that records the exit time (wall ms) of every process it learns of.

    ``parents()`` gives the pids whose children to watch (read every ``every`` seconds, with
    the parents themselves); ``ledger`` is read as it grows, for the pids of handler calls and
    of the programs they ran (tests/support/ledger.py).
    """

    def __init__(
        self, parents: Callable[[], Iterable[int]], ledger: Path, every: float = 0.01
    ) -> None:
        self.parents = parents
        self.ledger = ledger
        self.every = every
        self.seen_ms: dict[int, int] = {}  # pid -> when it was first seen
        self.ended_ms: dict[int, int] = {}  # pid -> when it exited
        self.late: set[int] = set()  # already gone when first seen
        self._fds: dict[int, int] = {}  # fd -> pid
        self._poll = select.poll()
        self._offset = 0
        self._partial = b""
        self._asked: list[int] = []  # pids watch() was given, for the thread to open
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="death-watch", daemon=True)

    def start(self) -> DeathWatch:
        if not hasattr(os, "pidfd_open"):
            raise RuntimeError("DeathWatch needs os.pidfd_open (Linux 5.3+, Python 3.9+)")
        self._thread.start()
        return self

    def stop(self) -> None:
        """One last look, then the thread ends and the pidfds are closed (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.ident is not None:  # (started)
            self._thread.join(10)
        with self._lock:
            self._look()
            self._collect(0)
            for fd in list(self._fds):
                self._poll.unregister(fd)
                os.close(fd)
            self._fds.clear()

    def watch(self, pid: int) -> None:
        """Watch ``pid`` too (a process the test knows of by other means), from the next look:
        only the watching thread changes what it polls."""
        with self._lock:
            self._asked.append(pid)

    def alive(self, pid: int) -> bool:
        """Seen and not (yet) seen to end."""
        with self._lock:
            return pid in self.seen_ms and pid not in self.ended_ms

    def ended(self, pid: int) -> int | None:
        with self._lock:
            return self.ended_ms.get(pid)

    # --- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._look()
            # Outside the lock: readers are never held up by the wait.
            ready = self._poll.poll(int(self.every * 1000))
            if ready:
                with self._lock:
                    self._ended([fd for fd, _ in ready])

    def _collect(self, timeout_ms: int) -> None:
        self._ended([fd for fd, _ in self._poll.poll(timeout_ms)])

    def _ended(self, fds: list[int]) -> None:
        now = wall_ms()
        for fd in fds:
            pid = self._fds.pop(fd, None)
            if pid is None:
                continue
            self.ended_ms.setdefault(pid, now)
            self._poll.unregister(fd)
            os.close(fd)

    def _look(self) -> None:
        for pid in self._asked:
            self._watch(pid)
        self._asked.clear()
        for parent in list(self.parents()):
            self._watch(parent)
            for child in children_of(parent):
                self._watch(child)
        for pid in self._ledger_pids():
            self._watch(pid)

    def _watch(self, pid: int) -> None:
        if pid <= 0 or pid in self.seen_ms:
            return
        now = wall_ms()
        self.seen_ms[pid] = now
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.ended_ms[pid] = now
            self.late.add(pid)
            return
        self._fds[fd] = pid
        self._poll.register(fd, select.POLLIN)

    def _ledger_pids(self) -> list[int]:
        """The pids in the ledger lines written since the last look."""
        try:
            with open(self.ledger, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        pids = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, list) and len(row) > 4:
                pids.append(int(row[4]))  # a start line: [id, ms, due, attempt, pid, ...]
            elif isinstance(row, dict):
                pids += [int(row.get("pid") or 0), int(row.get("child") or 0)]
        return pids
