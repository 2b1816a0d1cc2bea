"""Each consumer process leads a process group of its own, and the group dies with it.

A handler may start programs (``subprocess.run`` with no timeout, a pool of workers). When its
consumer process is replaced (a time limit it could not enforce, a process that stopped
answering, a recycling) or dies, those programs must not live on: re-parented to pid 1, they
would go on beside the retry of their message, which starts another copy. So:

- a consumer process leads a session, and so a process group, of its own (:func:`lead_group`
  after a fork; ``start_new_session`` for a fresh interpreter), which the programs its handlers
  start join;
- the supervisor kills that whole group (:func:`kill_group`) when it kills the process and once
  it has reaped it, whatever it died of;
- a ``kill -9`` of the supervisor kills its consumer processes (``PR_SET_PDEATHSIG``) but not
  what they started: each consumer process therefore starts a guard (:func:`guard_group`), a
  small program of its group (:mod:`.group_guard`) that waits, blocked, for that consumer
  process to die, then kills the group, itself included. It needs nothing of the consumer
  process to run (a handler stuck in a C call that holds the GIL cannot keep it from acting),
  holds no copy of its memory, and a group it belongs to can never be another's.

A program that leaves the group (a daemon that calls ``setsid``) is the handler's business: it
lives on. Terminal signals (Ctrl-C's SIGINT, a hangup) reach the supervisor alone, which stops
its consumer processes itself. Outside Linux there is no guard (no ``PR_SET_PDEATHSIG``): the
supervisor still kills the groups of the processes it reaps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from django_delayqueue.supervisor.group_guard import GUARD_SIGNAL, IGNORED

logger = logging.getLogger(__name__)

# The guard's program, and what it blocks from its start (its own signal until it waits for it,
# the stop signals until it ignores them).
GUARD_PROGRAM = str(Path(__file__).with_name("group_guard.py"))
_BLOCKED = {GUARD_SIGNAL, *IGNORED}


def lead_group() -> None:
    """In a process just forked by the supervisor: lead a new session and process group
    (no controlling terminal: a terminal's signals are the supervisor's)."""
    with contextlib.suppress(OSError):  # a group leader already (cannot happen after a fork)
        os.setsid()


def kill_group(pid: int) -> bool:
    """SIGKILL every process of the group ``pid`` leads; whether any was there. Safe after
    ``pid`` was reaped: a group's id is not given to another process while one of its members
    lives."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def guard_group() -> int | None:
    """Start the guard of this process's group (see module doc; its program:
    :mod:`.group_guard`); its pid, or None where there is none (not Linux, no interpreter to
    run it, or the start refused). Call it from the thread that lives as long as this process
    (its main thread): the parent-death signal follows the thread that started the guard.

    Spawned (``posix_spawn``: no copy of this process is made, not even for an instant) as a
    small interpreter of its own, which owns a few megabytes, not a copy of this heap.
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        return None
    leader = os.getpid()
    argv = [sys.executable, "-I", "-S", GUARD_PROGRAM, str(leader)]
    try:
        # Its signals blocked from its start: a systemd stop sends SIGTERM to every process,
        # maybe in the instant after the spawn; its own signal at its default action (this
        # process may ignore it), waited for.
        return os.posix_spawn(
            sys.executable, argv, os.environ, setsigmask=_BLOCKED, setsigdef={GUARD_SIGNAL}
        )
    except OSError as e:
        logger.warning("no guard for the process group of %d: %s", leader, e)
        return None
