"""Marks of deliveries claimed and not started, which another process can read after a kill.

A consumer process killed where none of its threads could act (a handler stuck in a C call
that holds the GIL: its supervisor kills it, see ``django_delayqueue.supervisor.liveness``)
cannot give back what it claimed and never ran: messages held ahead of a free handler thread,
waiting for their due time, or coroutines the event loop never reached. Left to their
visibility timeout, each would come back with an attempt used (reap.lua counts it), though its
handler never ran. So the consumer tells its :class:`StartMarks` what it claimed as it takes a
claim's reply in (:meth:`StartMarks.mark`) and, on every path, clears a mark *before* the
handler is called (:meth:`StartMarks.clear`): a mark the supervisor finds once the process is
gone names a delivery whose handler never ran, which it gives back (release.lua) with no
attempt used. A kill between the clear and the handler's call is charged, as any run is: a
handler that started must never come back uncharged (one that kills its process each time
would run for ever).

The marks cost each message a few hundred nanoseconds and no system call (a supervised child
writes them into memory its supervisor maps too); a consumer without a supervisor (plain
``runqueue``, a library caller) gets :data:`NO_START_MARKS`, which does nothing. A mark the
table has no room for is simply not made: that message is charged as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from django_delayqueue.core.envelope import Message


class StartMarks(Protocol):
    """Where a consumer marks what it claimed and has not started (see module doc)."""

    def mark(self, messages: Sequence[Message]) -> None:
        """``messages`` were just claimed (on the loop's thread): none has started."""
        ...

    def clear(self, message: Message) -> None:
        """``message``'s handler is about to be called, or it was given back by this process
        (any thread): no longer the supervisor's to give back."""
        ...


class NoStartMarks:
    """Marks nothing: a consumer whose process nobody reads after its death."""

    def mark(self, messages: Sequence[Message]) -> None:
        pass

    def clear(self, message: Message) -> None:
        pass


NO_START_MARKS = NoStartMarks()
