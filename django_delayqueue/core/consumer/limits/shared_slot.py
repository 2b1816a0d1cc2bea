"""How code given a copy of a handler thread's context finds that handler's Run.

asgiref's ``async_to_sync`` (in a sync handler or ``@task``, or Django dispatching async
receivers of a sync send) and ``contextvars.copy_context().run`` in a thread of the user's run
code on another thread with the handler's context copied: ``dq.abort_requested()``,
``stop_error()`` and ``current_run()`` must work there too. A handler thread finds its Run
through its :class:`~.limits.runs.Slot` (a thread-local, no context variable set per message), so
the slot is put in the thread's context once, as it is made (:meth:`.limits.runs.Runs.slot`).

A copy outlives its message if a thread of the user's keeps it: the first read through a copy
pins it to the message its thread runs then, and the thread puts a new :class:`SharedSlot` in
its context before its next message; so a copy read during one message never sees a later
one's Run. (A copy never read during its message, first read during a later one, cannot be
told from a copy of that later one without a context variable set per message: it sees it.)
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_delayqueue.core.consumer.limits.handler_run import Run
    from django_delayqueue.core.consumer.limits.runs import Slot
    from django_delayqueue.core.envelope import Message


class SharedSlot:
    """What a context copied from a handler thread carries (asgiref's ``async_to_sync``, a
    thread of the user's run with ``copy_context().run``): its thread's slot, set in the
    thread's context once (no set and reset per message). ``message`` is the delivery it was
    first read for on another thread: a copy kept past its message (a thread of the user's
    that outlives it) then sees no later message's Run; the handler thread puts a new one in
    its context before its next message once this one was read (see .limits.Runs.enter)."""

    __slots__ = ("message", "slot")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.message: Message | None = None


shared_slot: contextvars.ContextVar[SharedSlot | None] = contextvars.ContextVar(
    "dq_slot", default=None
)


def shared_run() -> Run | None:
    """The Run of the handler whose thread's context this one was copied from, if that
    handler still runs the message it was first asked for here (else None)."""
    shared = shared_slot.get()
    if shared is None:
        return None
    slot = shared.slot
    slot.shared = True  # first: its thread puts a new one in its context before its next message
    message = slot.message
    if shared.message is None:
        shared.message = message
    elif shared.message is not message:
        return None  # copied during an earlier message of that thread
    run = slot.run
    return run if run is not None and run.message is message else None
