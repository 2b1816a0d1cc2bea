"""Starting one consumer process for a slot: forked from the supervisor, or a fresh interpreter.

The supervising loop (:mod:`.loop`) decides when a slot needs a process; how one is started is
this module's: a fork with nothing open that the child should not inherit (the database
connections and the Redis pool closed first, the supervisor's pipes closed in the child, its
signals blocked across the fork), or, after a SIGHUP, the command line that started this
runqueue run again in a fresh interpreter (:mod:`.fresh`), which then loads the code on disk.
Kept apart because it is the one place that forks or spawns, and it holds none of the loop's
state: what it needs is given at construction (the options) and at each start (the open pipes).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace

from django_delayqueue.supervisor.child import (
    SUPERVISOR_SIGNALS,
    ChildSpec,
    SupervisedWorker,
    run_child,
)
from django_delayqueue.supervisor.children import Child, Slot, SupervisorOptions
from django_delayqueue.supervisor.fresh import child_environment
from django_delayqueue.supervisor.protocol import LineReader
from django_delayqueue.supervisor.settling import close_connections
from django_delayqueue.supervisor.start_marks import MarkTable

logger = logging.getLogger(__name__)


class ChildStarter:
    """Starts the consumer processes of the supervisor ``name`` (process ``pid``)."""

    def __init__(
        self,
        options: SupervisorOptions,
        name: str,
        pid: int,
        worker_class: type[SupervisedWorker] = SupervisedWorker,
    ) -> None:
        self.options = options
        self.name = name
        self.pid = pid
        self.worker_class = worker_class

    def start(self, slot: Slot, *, fresh: bool, open_fds: Sequence[int]) -> Child:
        """Start one child for ``slot``: a fresh interpreter when ``fresh`` (and this runqueue
        can be run again), else forked. ``open_fds``: the supervisor's own pipes, which a
        forked child closes (its siblings' start marks among them).

        Each child gets a table of start marks (supervisor.start_marks), made here before it
        starts: without one (it could not be made) it is started all the same, and what it
        claimed and never started comes back after its visibility timeout, charged."""
        try:
            marks: MarkTable | None = MarkTable.create()
        except OSError as e:
            logger.warning("no start marks for the next consumer process: %s", e)
            marks = None
        try:
            if fresh and self.options.restart is not None:
                child = self._start_fresh(slot, marks)
            else:
                child = self._fork(slot, open_fds, marks)
        except BaseException:
            if marks is not None:
                marks.close()
            raise
        child.marks = marks
        return child

    def _fork(self, slot: Slot, open_fds: Sequence[int], marks: MarkTable | None) -> Child:
        """Fork one child for ``slot``, with nothing open that it should not inherit."""
        close_connections()
        read_fd, write_fd = os.pipe()
        inherited = [*open_fds, read_fd]
        signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                name = f"{self.name}.{slot.index + 1}-{os.getpid()}"
                run_child(self._spec(slot, name, marks), write_fd, inherited)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SUPERVISOR_SIGNALS)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        child = Child(
            slot.index,
            pid,
            f"{self.name}.{slot.index + 1}-{pid}",
            LineReader(read_fd),
            time.monotonic(),
        )
        logger.info("consumer process %d started (slot %d)", pid, slot.index + 1)
        return child

    def _start_fresh(self, slot: Slot, marks: MarkTable | None) -> Child:
        """Start one child for ``slot`` in a fresh interpreter: the command line that started
        this runqueue, told by its environment to run as that child (supervisor.fresh)."""
        restart = self.options.restart
        assert restart is not None
        read_fd, write_fd = os.pipe()
        env = child_environment(self._spec(slot, "", marks), write_fd, os.environ)
        # Blocked until the child has its handlers (child._consume): a SIGTERM while it loads
        # Django waits for them instead of killing it, as for a forked child.
        signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
        try:
            # A session and process group of its own, as a forked child makes (supervisor.groups).
            process = subprocess.Popen(
                restart.argv,
                cwd=restart.cwd,
                env=env,
                pass_fds=(write_fd,) if marks is None else (write_fd, marks.fd),
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SUPERVISOR_SIGNALS)
        os.set_blocking(read_fd, False)
        child = Child(
            slot.index,
            process.pid,
            f"{self.name}.{slot.index + 1}-{process.pid}",
            LineReader(read_fd),
            time.monotonic(),
            process=process,
        )
        logger.info(
            "consumer process %d started (slot %d, a fresh interpreter)",
            process.pid,
            slot.index + 1,
        )
        return child

    def _spec(self, slot: Slot, name: str, marks: MarkTable | None) -> ChildSpec:
        o = self.options
        spec = ChildSpec(
            queues=o.queues,
            name=name,
            slot=slot.index + 1,
            supervisor_name=self.name,
            supervisor_pid=self.pid,
            concurrency=o.concurrency,
            grace_seconds=o.grace_seconds,
            max_messages=o.max_messages_per_child,
            max_memory_mb=o.max_memory_per_child_mb,
            worker_id=o.name,
            alive_file=o.alive_file,
            worker_class=self.worker_class,
        )
        return spec if marks is None else replace(spec, start_marks_fd=marks.fd)
