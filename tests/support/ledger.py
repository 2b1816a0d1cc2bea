"""An exact delivery ledger for fault drills: what was delivered, when, to whom, and why twice.

Handlers append one line per delivery *before* doing anything else, with ``O_APPEND`` (so lines
from many processes never interleave) and ``fsync`` (so a delivery is on disk even if the
process is killed a microsecond later). A line records the message id, the wall time of the
delivery, the due time, the attempt, the pid and what the handler is about to do with it
(``ok``, ``raise``, ``exit``, ``sleep``).

A handler may also append a second line as it returns or raises (:meth:`Ledger.finish`): a
JSON object (a :class:`Run`) with the start and end wall times of that call and the outcome the
consumer's journal must show for it. :func:`read` skips those lines, :func:`read_runs` reads them.

:func:`check` then proves the delivery guarantees against the set of scheduled ids:

- every scheduled id was delivered at least once (nothing lost);
- nothing was delivered that was never scheduled;
- nothing was delivered before its due time (1 ms allowed for rounding);
- every extra delivery has a recorded cause: the previous delivery of that id raised or killed
  its process on purpose, ran in a consumer the test killed (or stopped while the handler ran
  past the grace period), ran past its deadline on purpose, or overlapped a Redis outage the
  test caused. Anything else is an *unexplained* duplicate.

Also imported by ``bench/soak.py`` (it puts this directory on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

EARLY_TOLERANCE_MS = 1  # wall clock vs the Redis clock of the producer: rounding only

# What a handler did with a delivery; all but "ok" and "reject" explain a redelivery by
# themselves (a rejected message comes back only if someone requeues it).
OK, RAISE, EXIT, SLOW, REJECT = "ok", "raise", "exit", "slow", "reject"


@dataclass(frozen=True)
class Delivery:
    id: str
    delivered_ms: int
    due_ms: int
    attempt: int
    pid: int
    action: str = OK
    # The parent's pid: under ``runqueue`` (a supervisor and its consumer processes), the
    # process a test signals is the handler's parent (see :meth:`ran_under`).
    ppid: int = 0

    def ran_under(self, pids: set[int] | int) -> bool:
        """Whether this delivery ran in one of ``pids`` or in a child of one of them."""
        pids = {pids} if isinstance(pids, int) else pids
        return self.pid in pids or self.ppid in pids


@dataclass(frozen=True)
class Run:
    """One handler call that returned or raised, as the handler saw it (wall ms)."""

    id: str
    queue: str
    attempt: int
    pid: int
    started_ms: int
    finished_ms: int
    due_ms: int
    action: str  # what the payload asked this attempt to do
    outcome: str  # what the journal must record for it: ack, retry or garbage
    gen: int | None = None  # the test's generation of this id (payload "gen"), if any


class Ledger:
    """Append-only file of deliveries, safe to share between processes."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd: int | None = None

    def record(self, message_id: str, due_ms: int, attempt: int, action: str = OK) -> int:
        """Append one delivery (called by the handler first thing); returns its wall ms."""
        now = int(time.time() * 1000)
        row = [message_id, now, int(due_ms), int(attempt), os.getpid(), action, os.getppid()]
        self._write(row)
        return now

    def finish(
        self,
        message_id: str,
        queue: str,
        attempt: int,
        started_ms: int,
        due_ms: int,
        action: str,
        outcome: str,
        gen: int | None = None,
    ) -> None:
        """Append the end of a handler call (called by the handler last, in a ``finally``)."""
        run = Run(
            message_id,
            queue,
            int(attempt),
            os.getpid(),
            int(started_ms),
            int(time.time() * 1000),
            int(due_ms),
            action,
            outcome,
            gen,
        )
        self._write(asdict(run))

    def _write(self, row: object) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # One write() of a short line with O_APPEND is atomic between processes.
        os.write(self._fd, (json.dumps(row, separators=(",", ":")) + "\n").encode())
        if self.fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> list[Delivery]:
        return read(self.path)


def read(path: str | os.PathLike[str]) -> list[Delivery]:
    """Every delivery in the file; a torn last line (process killed mid-write) is skipped."""
    return [Delivery(*row) for row in _rows(path) if isinstance(row, list)]


def read_runs(path: str | os.PathLike[str]) -> list[Run]:
    """Every finished handler call in the file (the lines :meth:`Ledger.finish` wrote)."""
    return [Run(**row) for row in _rows(path) if isinstance(row, dict)]


def overlaps(runs: Iterable[Run]) -> list[tuple[Run, Run]]:
    """Pairs of runs of one message id whose calls overlapped in time (wall ms): two runs of a
    message at once, which no consumer may ever allow."""
    by_id: dict[str, list[Run]] = {}
    for run in runs:
        by_id.setdefault(run.id, []).append(run)
    found = []
    for rows in by_id.values():
        rows.sort(key=lambda r: r.started_ms)
        longest = rows[0]  # of the runs started so far, the one that ended last
        for later in rows[1:]:
            if later.started_ms < longest.finished_ms:
                found.append((longest, later))
            if later.finished_ms > longest.finished_ms:
                longest = later
    return found


def _rows(path: str | os.PathLike[str]) -> list[object]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@dataclass
class Causes:
    """What the test did that may legitimately cause a second delivery."""

    killed_pids: set[int] = field(default_factory=set)  # consumers killed (or force-stopped)
    outages: list[tuple[int, int]] = field(default_factory=list)  # Redis down/paused, wall ms
    outage_margin_ms: int = 0  # e.g. the visibility timeout: deadlines that ran out meanwhile
    # consumers stopped by one SIGTERM while a handler ran past --grace (its message stayed in
    # flight until its visibility timeout);
    # last, so that positional arguments (bench/soak.py) keep their meaning
    outgraced_pids: set[int] = field(default_factory=set)

    def explain(self, previous: Delivery) -> str | None:
        """Why a delivery after ``previous`` is expected, or None if it should not happen."""
        if previous.action == RAISE:
            return "handler raised (retry)"
        if previous.action == EXIT:
            return "handler killed its process"
        if previous.action == SLOW:
            return "handler ran past its deadline on purpose"
        if previous.ran_under(self.killed_pids):
            return "consumer killed mid-handler"
        if previous.ran_under(self.outgraced_pids):
            return "handler outlived --grace (visibility timeout)"
        for start, end in self.outages:
            if (
                start - self.outage_margin_ms
                <= previous.delivered_ms
                <= end + self.outage_margin_ms
            ):
                return "ack lost or late during a Redis outage"
        return None

    def explain_overlap(self, previous: Delivery) -> str | None:
        """Why a delivery may *start while* ``previous`` still runs, or None if it must not.

        Only a consumer killed while its handler ran. One stopped past --grace leaves the
        message in flight until its visibility timeout, by when it has exited; a handler that
        raised or ran long explains a later delivery, never a concurrent one.
        """
        if previous.ran_under(self.killed_pids):
            return "consumer killed mid-handler"
        return None


@dataclass
class Report:
    scheduled: int
    delivered: int
    distinct: int
    lost: list[str]
    unknown: list[str]
    early: list[Delivery]
    duplicates: Counter[str]  # cause -> extra deliveries
    unexplained: list[tuple[Delivery, Delivery]]  # (previous, again)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unknown or self.early or self.unexplained)

    def summary(self) -> str:
        return (
            f"scheduled={self.scheduled} delivered={self.delivered} distinct={self.distinct} "
            f"lost={len(self.lost)} unknown={len(self.unknown)} early={len(self.early)} "
            f"duplicates={dict(self.duplicates)} unexplained={len(self.unexplained)} "
            f"(first lost: {self.lost[:3]}, first early: {self.early[:2]}, "
            f"first unexplained: {self.unexplained[:2]})"
        )


def check(
    scheduled: Mapping[str, int] | Iterable[str],
    deliveries: Iterable[Delivery],
    causes: Causes | None = None,
) -> Report:
    """Compare deliveries with what was scheduled (id -> due ms, or just ids: no early check)."""
    causes = causes or Causes()
    due = dict(scheduled) if isinstance(scheduled, Mapping) else dict.fromkeys(scheduled, -1)
    by_id: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_id.setdefault(d.id, []).append(d)
    early = []
    duplicates: Counter[str] = Counter()
    unexplained = []
    total = 0
    for message_id, rows in by_id.items():
        rows.sort(key=lambda d: (d.delivered_ms, d.attempt))
        total += len(rows)
        expected_due = due.get(message_id, -1)
        for d in rows:
            if d.delivered_ms + EARLY_TOLERANCE_MS < max(d.due_ms, expected_due):
                early.append(d)
        for previous, again in pairwise(rows):
            cause = causes.explain(previous)
            if cause is None:
                unexplained.append((previous, again))
            else:
                duplicates[cause] += 1
    return Report(
        scheduled=len(due),
        delivered=total,
        distinct=len(by_id),
        lost=sorted(set(due) - set(by_id)),
        unknown=sorted(set(by_id) - set(due)),
        early=early,
        duplicates=duplicates,
        unexplained=unexplained,
    )
