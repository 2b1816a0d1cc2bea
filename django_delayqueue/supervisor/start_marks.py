"""A consumer process's start marks in memory its supervisor reads once the process is gone.

The consumer marks each delivery it claimed and has not started, and clears the mark before
its handler is called (``core.consumer.start_marks``). A supervised child keeps those marks in
a :class:`MarkTable` its supervisor created before starting it: a file in memory
(``memfd_create``; elsewhere an unlinked temporary file) that the child maps, named by a file
descriptor it inherits (a fork) or is passed (a fresh interpreter after SIGHUP:
``ChildSpec.start_marks_fd`` and ``pass_fds``). Writing a mark is a few bytes copied into the
mapping and an index taken from a Python list: no system call, no lock, a few hundred
nanoseconds. Once the child has exited, whatever way (killed for its silence, ``kill -9``, a
crash, a clean exit after Redis refused its stop's give-back), and been reaped, the supervisor
reads what is still marked (:meth:`MarkTable.read`) and gives it back through release.lua with
no attempt used (``supervisor.settling.give_back``); a token no longer current is skipped there.

The table: a header (:data:`MAGIC`, the slot size and count) and :data:`SLOTS` slots of
:data:`SLOT_SIZE` bytes: a state byte (1: marked), the length of the text that follows, and
that text in UTF-8: ``<ready since ms, or nothing>\\x1f<queue>\\x1f<token>\\x1f<id>`` (the id
last: whatever it holds, the split finds it whole; the others never hold the separator). Text
rather than packed numbers because it is what costs a message least to write. A mark writes
its length and text first and its state byte last, a clear its state byte alone, so a process
killed in the middle of either leaves a slot the supervisor reads whole or not at all. No free
slot, or a text longer than a slot holds (an id of some 200 characters): no mark (that
message is charged as before). A fresh interpreter of another release that does not know the
header's layout marks nothing.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from django_delayqueue.core.envelope import Message

logger = logging.getLogger(__name__)

MAGIC = b"DQMARKS2"
SLOTS = 4096  # marks a process holds at once at most (claimed ahead, waiting, on the loop)
SLOT_SIZE = 256
_HEADER = struct.Struct("<8sII")  # MAGIC, slot size, slot count
TEXT_SIZE = SLOT_SIZE - 2  # after the state byte and the length byte
TABLE_SIZE = _HEADER.size + SLOTS * SLOT_SIZE


@dataclass(frozen=True)
class Unstarted:
    """A delivery a consumer process had claimed and not started when it died."""

    queue: str  # physical
    message_id: str
    token: str
    ready_since_ms: int | None
    pid: int  # the process that claimed it

    def message(self) -> Message:
        """The message release.lua is given for it (what it checks and keeps)."""
        return Message(
            self.message_id,
            self.queue,
            None,
            0,
            0,
            0,  # not read by release.lua
            self.token,
            ready_since_ms=self.ready_since_ms,
        )


class MarkTable:
    """The supervisor's side: the table of one child, made before it starts (see module doc).

    ``fd`` is what the child is given; :meth:`read` once the child is gone; :meth:`close` then.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls) -> MarkTable:
        """A new table (raises OSError: the caller starts the child without one)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("delayqueue-start-marks")  # close-on-exec: pass_fds passes it
        else:
            fd, path = tempfile.mkstemp(prefix="delayqueue-start-marks-")
            os.unlink(path)  # gone with its last descriptor and mapping
        try:
            os.ftruncate(fd, TABLE_SIZE)  # zeros: every slot free
            os.pwrite(fd, _HEADER.pack(MAGIC, SLOT_SIZE, SLOTS), 0)
        except OSError:
            os.close(fd)
            raise
        return cls(fd)

    def read(self, pid: int) -> list[Unstarted]:
        """What the child ``pid`` left marked (it is gone): claimed and never started."""
        if self.fd < 0:
            return []
        data = os.pread(self.fd, TABLE_SIZE, 0)
        if len(data) < TABLE_SIZE or _HEADER.unpack_from(data) != (MAGIC, SLOT_SIZE, SLOTS):
            return []
        found = []
        for offset in range(_HEADER.size, TABLE_SIZE, SLOT_SIZE):
            if data[offset] != 1:
                continue
            length = data[offset + 1]
            try:
                text = data[offset + 2 : offset + 2 + min(length, TEXT_SIZE)].decode()
                since, queue, token, message_id = text.split("\x1f", 3)
                ready_since = int(since) if since else None
            except ValueError:  # not a mark this release wrote: left to its timeout
                continue
            if queue and token and message_id:
                found.append(Unstarted(queue, message_id, token, ready_since, pid))
        return found

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class StartMarkTable:
    """The child's side (a ``core.consumer.start_marks.StartMarks``): marks in the table its
    supervisor made. ``mark`` runs on the consumer's loop thread alone; ``clear`` on any
    thread: a slot index goes back to the free list only after its state byte is cleared, and
    only the loop thread takes one (list ``pop`` and ``append`` and dict ``pop`` are atomic)."""

    def __init__(self, table: mmap.mmap) -> None:
        self._table = table
        self._view = memoryview(table)  # cheaper to write through than the mmap itself
        self._free = list(range(SLOTS - 1, -1, -1))  # popped from the end: slot 0 first
        self._slots: dict[tuple[str, str], int] = {}  # (queue, token) -> slot

    @classmethod
    def open(cls, fd: int) -> StartMarkTable | None:
        """The table the supervisor passed as ``fd`` (closed here: the mapping stays), or None
        (another release's layout, or it cannot be mapped: nothing is marked)."""
        try:
            table = mmap.mmap(fd, TABLE_SIZE)
        except (OSError, ValueError) as e:
            logger.warning("start marks not kept (%s): a kill charges unstarted messages", e)
            return None
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        if _HEADER.unpack_from(table) != (MAGIC, SLOT_SIZE, SLOTS):
            table.close()
            logger.warning("start marks not kept: a table of another release")
            return None
        return cls(table)

    def mark(self, messages: Sequence[Message]) -> None:
        free, slots, view = self._free, self._slots, self._view
        for m in messages:
            since = m.ready_since_ms
            # One f-string of strings: a single allocation (concatenation made three).
            if since is None:
                text = f"\x1f{m.queue}\x1f{m.token}\x1f{m.id}".encode()
            else:
                text = f"{since}\x1f{m.queue}\x1f{m.token}\x1f{m.id}".encode()
            length = len(text)
            if length > TEXT_SIZE or not free:  # too long, or full: not marked (charged)
                continue
            index = free.pop()
            offset = index * SLOT_SIZE + _HEADER.size
            view[offset + 1] = length
            view[offset + 2 : offset + 2 + length] = text
            view[offset] = 1  # last: a slot is read only once whole
            slots[m.queue, m.token] = index

    def clear(self, message: Message) -> None:
        index = self._slots.pop((message.queue, message.token), None)
        if index is not None:
            self._view[index * SLOT_SIZE + _HEADER.size] = 0
            self._free.append(index)

    def marked(self) -> int:
        """How many marks are held now (tests)."""
        return len(self._slots)
