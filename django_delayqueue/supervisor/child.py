"""A supervised child: the consumer process a supervisor forks (``runqueue --processes N``).

The child is forked after Django is set up, so it starts at once with every app loaded (after
a SIGHUP it is a fresh ``runqueue`` interpreter that runs :func:`run_child` too: .fresh). It
leads a process group of its own, which dies with it (:mod:`.groups`), and it dies with its
supervisor (Linux: ``PR_SET_PDEATHSIG``; elsewhere, and for the instant before it is set, a
check of the parent pid), so a ``kill -9`` of the supervisor leaves no consumer behind, nor a
program one of its handlers started: the messages the children held come back after their
visibility timeout, as for any process killed mid-handler. A thread of its own tells the
supervisor it is alive (:mod:`.liveness`): silent past what it asked for, it is killed.

Signals: the supervisor owns them. A child stops gracefully on SIGTERM (once: a second SIGTERM,
from systemd's ``KillMode=control-group``, is the same request) and at once on SIGUSR1, which
only the supervisor sends (on a second SIGTERM/SIGINT). SIGINT and SIGHUP, which a terminal
sends to its foreground group, reach the supervisor alone (a child leads a session of its own),
and a child ignores them all the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.supervisor.groups import guard_group, lead_group
from django_delayqueue.supervisor.liveness import Heartbeat, Held, Holding, QueueLimits
from django_delayqueue.supervisor.memory import RecyclePolicy
from django_delayqueue.supervisor.protocol import (
    FAILED,
    FATAL,
    READY,
    RECYCLE,
    STOPPED,
    ChildChannel,
)
from django_delayqueue.supervisor.settling import forget_inherited_connections
from django_delayqueue.supervisor.start_marks import StartMarkTable
from django_delayqueue.worker import Worker

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SUPERVISOR_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD}


class SupervisedWorker(Worker):
    """The Django worker as a supervised child runs it: says when it consumes, when it wants to
    be recycled, and which handlers it could not stop."""

    stops_when_replaced = False  # the supervisor stops it once its successor consumes

    def __init__(
        self,
        queues: Sequence[Any],
        *,
        channel: ChildChannel,
        recycle: RecyclePolicy | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(queues, **kwargs)
        self.channel = channel
        self.recycle = recycle or RecyclePolicy()
        self._said_ready = False

    def run(self) -> int:
        # Beats until the process exits (a daemon thread): a handler given up on at the stop
        # may still hold the GIL while the process ends, and its lease is still renewed.
        Heartbeat(self.channel, self.holding).start()
        return super().run()

    def holding(self) -> Holding:
        """What this process holds now, for its heartbeat (supervisor.liveness): on the
        heartbeat's thread."""
        queues = [
            QueueLimits(q.name, q.settings.visibility_timeout, q.settings.time_limit)
            for q in list(self.queues)
        ]
        now = time.monotonic()
        running = []
        for r in self._threads.running():
            m = r.message
            run = self._runs.get(m.queue, m.token)
            settings = self._settings_of(m.queue)
            limit = None if settings is None else settings.time_limit
            running.append(
                Held(
                    m.queue,
                    m.id,
                    m.token,
                    m.attempt,
                    m.task,
                    abort=None if run is None else run.abort_reason,
                    time_limit=limit,
                    limit_in=None if limit is None else r.started_monotonic + limit - now,
                    stopped=run is not None and run.stop is not None,
                )
            )
        return Holding(queues, running)

    def step(self, now_ms: int | None = None) -> int:
        if self.supervisor and os.getppid() != self.supervisor["pid"]:  # orphaned (no prctl)
            self.stop_at_once()
        claimed = super().step(now_ms)
        if not self._said_ready:  # a round trip went through: this process consumes
            self._said_ready = True
            self.channel.send(READY)
        why = self.recycle.reason(self.delivered)
        if why is not None:
            logger.info("%s asks to be replaced: %s", self.name, why)
            self.channel.send(RECYCLE, reason=why, memory=self.recycle.for_memory)
        return claimed

    def replacement_needed(self, stopped: list[StoppedHandler]) -> None:
        """Tell the supervisor at once: it starts a replacement now, and settles ``stopped``
        only once this process has exited (so a stopped handler never runs beside its own
        redelivery). This consumer serves on (stops_when_replaced is False) until its successor
        consumes: then the supervisor stops it as on SIGTERM, so its queues have no gap."""
        logger.warning(
            "%s could not stop %d handler(s): this process is being replaced",
            self.name,
            len(stopped),
        )
        self.channel.send(STOPPED, handlers=[s.to_json() for s in stopped])

    def stop_gracefully(self) -> None:
        """SIGTERM: the first request only (a repeated SIGTERM is the same stop)."""
        if not self.stopping:
            self.request_stop()

    def stop_at_once(self) -> None:
        """SIGUSR1 (the supervisor's second signal): stop without waiting for handlers."""
        if not self.stopping:
            self.request_stop()
        self.request_stop()


@dataclass(frozen=True)
class ChildSpec:
    """Everything a child needs to build its worker (decided by the supervisor)."""

    queues: list[str] | None
    name: str
    slot: int
    supervisor_name: str
    supervisor_pid: int
    concurrency: int | None
    grace_seconds: float
    max_messages: int | None
    max_memory_mb: float | None
    # The name runqueue was given (--name), which task results list in worker_ids; None: the
    # child's own name.
    worker_id: str | None = None
    # runqueue --alive-file (django_delayqueue.alive); None: none.
    alive_file: str | None = None
    worker_class: type[SupervisedWorker] = SupervisedWorker
    # The descriptor of its start marks' table (supervisor.start_marks); None: none.
    start_marks_fd: int | None = None


def run_child(spec: ChildSpec, write_fd: int, inherited_fds: Sequence[int]) -> NoReturn:
    """The forked child's whole life; never returns into the supervisor's code."""
    code = 1
    channel = ChildChannel(write_fd)
    try:
        # First: a group of its own, which what its handlers start joins (supervisor.groups).
        lead_group()
        _die_with(spec.supervisor_pid)
        signal.set_wakeup_fd(-1)
        for fd in inherited_fds:  # the supervisor's ends of its other pipes
            with contextlib.suppress(OSError):
                os.close(fd)
        guard_group()  # kills the group once this process is gone, a supervisor gone too
        forget_inherited_connections()
        code = _consume(spec, channel)
    except BaseException as e:  # never unwind into the supervisor's frames
        # The supervisor logs it (in full once per distinct error: a child that fails at
        # every start would repeat the same traceback for ever).
        error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        if not channel.send(FAILED, error=error, traceback=traceback.format_exc()[-20000:]):
            logger.exception("consumer process %s failed", spec.name)
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _consume(spec: ChildSpec, channel: ChildChannel) -> int:
    early: list[int] = []  # signals before the worker exists
    signal.signal(signal.SIGTERM, lambda signum, _: early.append(signum))
    signal.signal(signal.SIGUSR1, lambda signum, _: early.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SUPERVISOR_SIGNALS)
    marks = None if spec.start_marks_fd is None else StartMarkTable.open(spec.start_marks_fd)
    try:
        built = spec.worker_class.for_queues(
            spec.queues,
            grace_seconds=spec.grace_seconds,
            name=spec.name,
            worker_id=spec.worker_id,
            alive_file=spec.alive_file,
            channel=channel,
            recycle=RecyclePolicy(spec.max_messages, spec.max_memory_mb),
            start_marks=marks,
        )
    except ConfigurationError as e:
        channel.send(FATAL, message=str(e), code=1)
        return 1
    worker = cast(SupervisedWorker, built)
    worker.supervisor = {
        "name": spec.supervisor_name,
        "pid": spec.supervisor_pid,
        "slot": spec.slot,
    }
    worker.concurrency = spec.concurrency
    signal.signal(signal.SIGTERM, lambda *_: worker.stop_gracefully())
    signal.signal(signal.SIGUSR1, lambda *_: worker.stop_at_once())
    for signum in early:
        worker.stop_at_once() if signum == signal.SIGUSR1 else worker.stop_gracefully()
    # As runqueue alone: start with what staff published, and judge the servers (they may
    # have changed since the supervisor judged them: a restart with another config).
    worker.refresh()
    if not worker.refused:
        code = worker.run()
    if worker.refused:
        channel.send(FATAL, message=worker.refused, code=1)
        return 1
    return code


def _die_with(supervisor_pid: int) -> None:
    """Be killed when the supervisor dies, and exit now if it is already gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl (a libc without it): the check alone
            logger.debug("PR_SET_PDEATHSIG not available")
    if os.getppid() != supervisor_pid:  # died between the fork and the prctl
        os._exit(1)
