"""What a child tells its supervisor, one JSON line per message on a pipe (child -> parent).

The parent talks to a child with signals only (SIGTERM: stop gracefully, a second: at once;
SIGKILL past its grace), so the pipe goes one way. A line is short (the stopped handlers of a
time limit and the running ones of a heartbeat are the longest) and is written whole: the
child's loop thread and its heartbeat thread (:mod:`.liveness`) write under one lock, which the
heartbeat only ever tries (:class:`ChildChannel`).
"""

from __future__ import annotations

import errno
import json
import os
import select
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
    handled by the parent-death signal, not here).

    Two threads write: the loop thread (:meth:`send`: its messages must arrive, so it waits for
    room in the pipe) and the heartbeat thread (:meth:`offer`: a beat goes now or is dropped,
    the next one says as much). The heartbeat never waits, neither for the lock nor for room,
    so a supervisor slow to read (settling on a Redis that is down) can never make the loop
    thread wait on a beat blocked in a write. The pipe is non-blocking for that: a line that
    did not fit whole is finished by the next writer, before its own line (``_rest``), so lines
    never interleave.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._lock = threading.Lock()  # two writers: a line longer than PIPE_BUF is not atomic
        self._rest = b""  # what is left of a line begun (under the lock)

    def send(self, kind: str, **fields: Any) -> bool:
        """Write a message whole, waiting for room in the pipe (the loop thread's); whether
        it was written."""
        data = _line(kind, fields)
        with self._lock:
            try:
                self._rest = _write(self.fd, self._rest + data, wait=True)
            except OSError:
                self._rest = b""
                return False
        return True

    def offer(self, kind: str, **fields: Any) -> bool:
        """Write a message if it can go now, never waiting (the heartbeat's): False when the
        loop thread is writing, or the pipe is full; a line begun is finished by the next
        writer. Whether it was written whole."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._rest:  # first, what was left of a line begun
                self._rest = _write(self.fd, self._rest, wait=False)
                if self._rest:
                    return False
            data = _line(kind, fields)
            rest = _write(self.fd, data, wait=False)
            self._rest = rest if len(rest) < len(data) else b""  # begun: to finish; or dropped
            return not rest
        except OSError:
            self._rest = b""
            return False
        finally:
            self._lock.release()


def _line(kind: str, fields: dict[str, Any]) -> bytes:
    return (json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n").encode()


def _write(fd: int, data: bytes, *, wait: bool) -> bytes:
    """Write ``data`` to the non-blocking ``fd``; what is left of it once the pipe is full
    (``wait``: nothing, it waits for room). Raises OSError (the supervisor is gone)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            if not wait:
                break
            select.select([], [fd], [])
            continue
        view = view[written:]
    return bytes(view)


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
