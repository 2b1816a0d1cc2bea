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
  forked process of its group that waits, blocked, for that consumer process to die, then kills
  the group, itself included. It needs nothing of the consumer process to run (a handler stuck
  in a C call that holds the GIL cannot keep it from acting), and a group it belongs to can
  never be another's.

A program that leaves the group (a daemon that calls ``setsid``) is the handler's business: it
lives on. Terminal signals (Ctrl-C's SIGINT, a hangup) reach the supervisor alone, which stops
its consumer processes itself. Outside Linux there is no guard (no ``PR_SET_PDEATHSIG``): the
supervisor still kills the groups of the processes it reaps.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from typing import Any

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15
# The signal the guard gets when its consumer process dies (blocked, and waited for).
GUARD_SIGNAL = signal.SIGUSR2
GUARD_NAME = b"dq-group-guard"  # what ps shows for it (at most 15 bytes)


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


# What a stop sends to every process of the group, which the guard ignores.
_IGNORED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}


def guard_group() -> int | None:
    """Fork the guard of this process's group (see module doc); its pid, or None where there is
    none (not Linux, no ``prctl``, or fork refused). Call it from the thread that lives as long
    as this process (its main thread): the parent-death signal follows the thread that forked.
    """
    if not sys.platform.startswith("linux"):
        return None
    leader = os.getpid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    # Blocked across the fork: the guard's own signal until it waits for it, and the stop
    # signals until it ignores them (a systemd stop sends SIGTERM to every process, maybe in
    # the instant after the fork).
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {GUARD_SIGNAL, *_IGNORED})
    try:
        pid = os.fork()
    except OSError as e:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        logger.warning("no guard for the process group of %d: %s", leader, e)
        return None
    if pid == 0:  # the guard: never returns
        _guard(leader, prctl)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid


def _guard(leader: int, prctl: Any) -> None:
    try:
        for signum in _IGNORED:
            signal.signal(signum, signal.SIG_IGN)  # only its leader's death ends it
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
        prctl(PR_SET_NAME, ctypes.c_char_p(GUARD_NAME), 0, 0, 0)
        prctl(PR_SET_PDEATHSIG, GUARD_SIGNAL, 0, 0, 0)
        _close_inherited()
        # Only its leader's death ends it: a GUARD_SIGNAL someone else sends (a `pkill -USR2`
        # meant for stack dumps) is waited past. The kernel reparents the guard before it sends
        # the parent-death signal, so the parent pid has changed when that one comes.
        while os.getppid() == leader:  # else it died before the prctl: act now
            signal.sigwait({GUARD_SIGNAL})
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _close_inherited() -> None:
    """Nothing of the leader's kept open in the guard (its pipe to the supervisor, its
    sockets), but the standard streams."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)
