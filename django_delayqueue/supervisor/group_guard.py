"""The guard of a consumer process's group, run as a program of its own (see :mod:`.groups`).

Started by :func:`.groups.guard_group` with ``python -I -S <this file> <leader pid>``, its
signals blocked from the start (its own, and those a stop sends to every process). It imports
nothing but the standard library's smallest parts, so it holds a few megabytes of its own
instead of a copy of the consumer process's heap (a forked guard came to own 24 to 110 MB of
pages its consumer process had since written over). What it does, in order:

- it ignores the stop signals (then unblocks them): a systemd stop sends SIGTERM to every
  process of the group, and only its leader's death may end it;
- it takes its name (what ``ps`` and /proc/<pid>/comm show) and asks for
  :data:`GUARD_SIGNAL` when its parent, the leader, dies (``PR_SET_PDEATHSIG``);
- it waits for that signal, blocked: one someone else sends (a ``pkill -USR2`` meant for
  stack dumps) is waited past, since the kernel reparents the guard before it sends the
  parent-death signal, so the parent pid has changed when that one comes (and has already
  changed if the leader died before the ``prctl``: it acts at once);
- then it kills the group, itself included.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15
# The signal the guard gets when its leader dies (blocked, and waited for).
GUARD_SIGNAL = signal.SIGUSR2
GUARD_NAME = b"dq-group-guard"  # what ps shows for it (at most 15 bytes)
# What a stop sends to every process of the group, which the guard ignores.
IGNORED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1})


def guard(leader: int) -> None:
    """Kill this process's group once ``leader``, its parent, has died (see module doc)."""
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)  # only its leader's death ends it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED)
    # Nothing of the leader's kept open (its pipe to the supervisor, its sockets), but the
    # standard streams.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_NAME, ctypes.c_char_p(GUARD_NAME), 0, 0, 0)
    prctl(PR_SET_PDEATHSIG, GUARD_SIGNAL, 0, 0, 0)
    while os.getppid() == leader:  # else it died before the prctl: act now
        signal.sigwait({GUARD_SIGNAL})
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    try:
        guard(int(sys.argv[1]))
    finally:
        os._exit(0)
