"""A consumer process's start marks in memory its supervisor reads once the process is gone.

The consumer marks each delivery it claimed and has not started, and clears the mark before
its handler is called (``core.consumer.start_marks``). A supervised child keeps those marks in
a :class:`MarkTable` its supervisor created before starting it: a file in memory
(``memfd_create``; elsewhere an unlinked temporary file) that the child maps, named by a file
descriptor it inherits (a fork) or is passed (a fresh interpreter after SIGHUP:
``ChildSpec.start_marks_fd`` and ``pass_fds``). Writing a mark is a struct packed into the
mapping and an index taken from a Python list: no system call, no lock, a few hundred
nanoseconds. Once the child has exited, whatever way (killed for its silence, ``kill -9``, a
crash, a clean exit after Redis refused its stop's give-back), and been reaped, the supervisor
reads what is still marked (:meth:`MarkTable.read`) and gives it back through release.lua with
no attempt used (``supervisor.settling.give_back``); a token no longer current is skipped there.

The table: a header (:data:`MAGIC`, the slot size and count) and :data:`SLOTS` slots of
:data:`SLOT_SIZE` bytes: a state byte (1: marked), then the ready-since time (ms, -1 for
none), the attempt, the lengths of the queue, token and id, and their UTF-8 bytes. A mark
writes its fields first and its state byte last, a clear its state byte alone, so a process
killed in the middle of either leaves a slot the supervisor reads whole or not at all. No free
slot, or a mark whose names do not fit: no mark (that message is charged as before). A fresh
interpreter of another release that does not know the header's layout marks nothing.
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

MAGIC = b"DQMARKS1"
SLOTS = 1024  # marks a process holds at once at most (claimed ahead, waiting, on the loop)
SLOT_SIZE = 256
_HEADER = struct.Struct("<8sII")  # MAGIC, slot size, slot count
_FIELDS = struct.Struct("<qiBBH")  # ready since (ms, -1: none), attempt, queue, token, id lengths
NAMES_SIZE = SLOT_SIZE - 1 - _FIELDS.size  # the queue's, token's and id's bytes together
# One slot after its state byte: the fields and the names (padded with zeros).
_SLOT = struct.Struct(f"<qiBBH{NAMES_SIZE}s")
TABLE_SIZE = _HEADER.size + SLOTS * SLOT_SIZE


@dataclass(frozen=True)
class Unstarted:
    """A delivery a consumer process had claimed and not started when it died."""

    queue: str  # physical
    message_id: str
    token: str
    attempt: int
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
            self.attempt,
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
            since, attempt, q_len, t_len, i_len, names = _SLOT.unpack_from(data, offset + 1)
            try:
                queue = names[:q_len].decode()
                token = names[q_len : q_len + t_len].decode()
                message_id = names[q_len + t_len : q_len + t_len + i_len].decode()
            except UnicodeDecodeError:  # not a mark this release wrote: left to its timeout
                continue
            if not (queue and token and message_id) or q_len + t_len + i_len > NAMES_SIZE:
                continue
            found.append(
                Unstarted(queue, message_id, token, attempt, None if since < 0 else since, pid)
            )
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
        self._free = list(range(SLOTS - 1, -1, -1))  # popped from the end: slot 0 first
        self._slots: dict[tuple[str, str], int] = {}  # (queue, token) -> slot
        self._queue_bytes: dict[str, bytes] = {}

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
        free, slots, table, names_of = self._free, self._slots, self._table, self._queue_bytes
        for m in messages:
            if not free:  # full: not marked (charged as without marks)
                return
            queue = names_of.get(m.queue)
            if queue is None:
                queue = names_of[m.queue] = m.queue.encode()
            token, message_id = m.token.encode(), m.id.encode()
            if len(queue) + len(token) + len(message_id) > NAMES_SIZE:
                continue  # names too long for a slot: not marked
            since = m.ready_since_ms
            index = free.pop()
            offset = _HEADER.size + index * SLOT_SIZE
            try:
                _SLOT.pack_into(
                    table,
                    offset + 1,
                    -1 if since is None else since,
                    m.attempt,
                    len(queue),
                    len(token),
                    len(message_id),
                    queue + token + message_id,
                )
            except struct.error:  # a number out of range (a corrupt attempt count)
                free.append(index)
                continue
            table[offset] = 1  # last: a slot is read only once whole
            slots[(m.queue, m.token)] = index

    def clear(self, message: Message) -> None:
        index = self._slots.pop((message.queue, message.token), None)
        if index is not None:
            self._table[_HEADER.size + index * SLOT_SIZE] = 0
            self._free.append(index)

    def marked(self) -> int:
        """How many marks are held now (tests)."""
        return len(self._slots)
