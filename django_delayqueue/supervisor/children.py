"""What the supervisor knows of its children and their slots."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.supervisor.backoff import RestartBackoff
from django_delayqueue.supervisor.fresh import RestartCommand
from django_delayqueue.supervisor.groups import kill_group
from django_delayqueue.supervisor.liveness import Held
from django_delayqueue.supervisor.protocol import LineReader
from django_delayqueue.supervisor.start_marks import MarkTable


@dataclass
class Child:
    slot: int
    pid: int
    name: str
    reader: LineReader
    started: float
    ready: bool = False
    told_to_stop: bool = False
    kill_at: float | None = None
    killed: bool = False  # SIGKILLed by the supervisor (past its deadline)
    stopped: list[StoppedHandler] = field(default_factory=list)  # to settle once it is gone
    # A fresh interpreter (after SIGHUP): reaped by the supervisor's waitpid, never by Popen.
    process: subprocess.Popen[bytes] | None = None
    # The exception it said it ends on (protocol.FAILED): one line, and its traceback.
    error: str | None = None
    error_details: str | None = None
    # Its heartbeat (supervisor.liveness): killed if silent past answer_by (time.monotonic());
    # what bounds that wait; its running handlers, with when each one's time limit passes.
    answer_by: float | None = None
    answer_why: str = ""
    heard_at: float = 0.0
    running: list[tuple[Held, float | None]] = field(default_factory=list)
    silent: float | None = None  # killed after that many seconds of silence
    # Forked from the supervisor's code while its children are fresh interpreters: a stand-in
    # for a process that had to be replaced when no fresh interpreter could start.
    stand_in: bool = False
    # What it claimed and has not started (supervisor.start_marks): read once it is reaped.
    marks: MarkTable | None = None

    def note_stopped(self, handlers: list[StoppedHandler], *, reported: bool) -> None:
        """Settle ``handlers`` once this process is gone, each message once: what the process
        reported itself (``reported``: protocol.STOPPED) takes the place of what its last
        heartbeat said of the same delivery (a process killed for its silence may have written
        its report just before, read only as it is reaped); a delivery already noted is not
        noted again (it would be nacked twice, the second time "left alone")."""
        index = {(s.queue, s.token): i for i, s in enumerate(self.stopped)}
        for handler in handlers:
            i = index.get((handler.queue, handler.token))
            if i is None:
                index[(handler.queue, handler.token)] = len(self.stopped)
                self.stopped.append(handler)
            elif reported:
                self.stopped[i] = handler

    @property
    def replaced(self) -> bool:
        """Being replaced for a handler it could not stop, or killed for its silence: its end
        is no failure of a stop (nor of runqueue's exit code)."""
        return bool(self.stopped) or self.silent is not None


@dataclass
class Slot:
    index: int
    current: Child | None = None
    successor: Child | None = None
    replace_wanted: str | None = None  # why (recycling, SIGHUP), until a successor serves
    not_before: float = 0.0  # backoff after quick deaths
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    # Its process holds a handler it could not stop (or was killed for its silence): it must
    # be replaced, from the supervisor's code if no fresh interpreter can start (``fresh_failed``
    # says why the last one could not).
    stuck: bool = False
    fresh_failed: str | None = None
    # Replacements asked for memory soon after a start are paced as quick deaths are (a
    # fresh process is as large: replaced at once, it would only ask again).
    memory_backoff: RestartBackoff = field(default_factory=RestartBackoff)


@dataclass(frozen=True)
class SupervisorOptions:
    queues: list[str] | None = None
    processes: int = 1
    concurrency: int | None = None
    grace_seconds: float = 30.0
    max_messages_per_child: int | None = None
    max_memory_per_child_mb: float | None = None
    name: str | None = None
    # runqueue --alive-file: each child touches it as its loop goes round (django_delayqueue.alive).
    alive_file: str | None = None
    # How to run this runqueue again (fresh.restart_command); None: SIGHUP forks.
    restart: RestartCommand | None = None


def send_signal(child: Child, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited: reaped by the next reap
        os.kill(child.pid, signum)


def kill(child: Child) -> None:
    """SIGKILL ``child`` and every process of its group (what its handlers started)."""
    kill_group(child.pid)
    send_signal(child, signal.SIGKILL)  # not a group leader yet (just forked): itself


def describe_exit(code: int) -> str:
    """``os.waitstatus_to_exitcode``'s value in words."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
