"""What a child tells its supervisor, one JSON line per message on a pipe (child -> parent).

The parent talks to a child with signals only (SIGTERM: stop gracefully, a second: at once;
SIGKILL past its grace), so the pipe goes one way. A line is short (the stopped handlers of a
time limit and the running ones of a heartbeat are the longest) and is written whole: the
child's loop thread and its heartbeat thread (:mod:`.liveness`) write under one lock.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from typing import Any

# The child consumes (its first round trip is done): a successor's predecessor may stop now.
READY = "ready"
# The child reached --max-messages-per-child or --max-memory-per-child: replace me ("reason";
# "memory": true for the memory limit, whose replacements soon after a start are paced).
RECYCLE = "recycle"
# Handlers the child could not stop (core.consumer.limits.stopped.StoppedHandler, as JSON); it stops
# itself as on SIGTERM: start a replacement now, settle them once this process is gone.
STOPPED = "stopped"
# A configuration error (an evicting Redis found later): stop everything with ``code``.
FATAL = "fatal"
# The child is ending on an exception: ``error`` (one line) and ``traceback``. The supervisor
# logs it, in full once per distinct error (supervisor.start_failures).
FAILED = "failed"
# The child is alive (a heartbeat, from a thread of its own: supervisor.liveness): hear from it
# again ``within`` seconds or kill it; ``running``, when it changed, its running handlers.
ALIVE = "alive"


class ChildChannel:
    """The child's end: sends messages to the supervisor (never raises: a supervisor gone is
    handled by the parent-death signal, not here)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()  # two writers: a line longer than PIPE_BUF is not atomic

    def send(self, kind: str, **fields: Any) -> bool:
        """Whether the message was written whole."""
        data = (json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                while data:
                    written = os.write(self.fd, data)
                    data = data[written:]
            except OSError:
                return False
        return True


class LineReader:
    """The supervisor's end of one child's pipe: complete lines decoded as they arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self.closed = False

    def read(self) -> list[dict[str, Any]]:
        """The messages available now (the fd is non-blocking); sets ``closed`` at EOF."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        messages = []
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                messages.append(message)
        return messages

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
