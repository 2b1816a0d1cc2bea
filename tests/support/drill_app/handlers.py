"""The receiver of queues "drill", "drill2" and "drill3": records each delivery in the ledger,
then does what the payload asks (``{"do": ACTION}``; default ``$DRILL_MODE`` or "ok").

``do`` may also be a list, one action per attempt (the last one for every later attempt):
``{"do": ["sleep:600", "ok"]}`` blocks on the first delivery and succeeds on the next.

Actions: ``ok`` (return), ``raise`` (RuntimeError), ``exit`` (``os._exit(3)``: the process
dies), ``sleep:S`` (sleep S seconds, then return), ``systemexit`` and ``baseexception`` (a
BaseException, past any ``except Exception``), ``retry:D`` (``raise dq.Retry(delay=D)``),
``badretry:X`` (a Retry whose ``delay`` was set to X after construction: inf, nan, -1, 1e300,
values Retry itself refuses), ``reject`` (``raise dq.Reject``), ``block`` (a socket read with
no timeout that never returns: what a time limit must stop), ``hold:MB`` (keep MB megabytes
alive in the process for good: memory a worker leaks), ``gil:S`` (a second in Python, then one
C call that holds the GIL for S seconds, as a catastrophic regex or some C extensions do: no
thread of the process runs meanwhile, its heartbeat neither; the second lets a heartbeat name
the handler first), ``gilgo:S`` (as ``gil:S``, but the C call comes once the file
``$DRILL_LEDGER.go`` exists, waited for in Python: a test decides when the process falls
silent), ``program:S`` (run ``sleep S`` as a subprocess and wait
for it, as ``subprocess.run`` with no timeout; its pid is appended to ``$DRILL_LEDGER.programs``,
and the ledger has a :class:`ledger.Part` line as it starts, with its pid, and one as the handler
saw it end), ``spin:S`` (a Python loop on the CPU for S seconds: stoppable at any instruction).

As the handler returns or raises it appends the end of the call to the ledger too (start and
end wall times, and the outcome the consumer's journal must show: ack, retry or garbage).

Queue "drill-async" has an ``async def`` receiver that does the same actions in a thread it
awaits, the way the payload's ``"via"`` says (:data:`VIA`; default ``to_thread``): what a
cancelled coroutine leaves running. The thread appends a "thread" :class:`ledger.Part` line
as it starts and one as it ends, which may be after the coroutine's end line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.dispatch import receiver
from ledger import EXIT, OK, RAISE, REJECT, SLOW, Ledger

import django_delayqueue as dq
from django_delayqueue.api import topic
from django_delayqueue.core import Message

ASYNC_QUEUE = "drill-async"
# The drill queues, and the queues $DRILL_RECEIVE names (a JSON list: queues a test adds with
# $DRILL_QUEUES, drill_settings.py, for this receiver; others may have handlers of their own).
QUEUES = tuple(
    dict.fromkeys(["drill", "drill2", "drill3", *json.loads(os.environ.get("DRILL_RECEIVE", "[]"))])
)

_ledger = Ledger(os.environ["DRILL_LEDGER"])
_held: list[bytes] = []  # what "hold:MB" keeps alive

# Action name (before any ":") -> what the start line says, and what the journal must say.
_KINDS = {
    "raise": RAISE,
    "exit": EXIT,
    "systemexit": RAISE,
    "baseexception": RAISE,
    "retry": RAISE,
    "badretry": RAISE,
    "reject": REJECT,
    "block": SLOW,  # past its time limit on purpose: stopped, retried
    "gil": SLOW,  # its process killed by its supervisor: retried
    "gilgo": SLOW,
    "program": SLOW,
}
# Every other action in _KINDS fails the attempt (retry); an unknown one does nothing (ack).
_OUTCOMES = {"ok": "ack", "sleep": "ack", "reject": "garbage", "spin": "ack"}


class DrillBaseException(BaseException):
    """What a library might raise past ``except Exception``: a failed attempt all the same."""


def _expected_outcome(name: str, message: Message) -> str:
    """What the journal must say: a failed attempt is "retry", or "garbage" when it was the
    queue's last (nack.lua buries it, whatever retry was asked)."""
    if name in _OUTCOMES or name not in _KINDS:
        return _OUTCOMES.get(name, "ack")
    max_attempts = settings.DELAYQUEUE["QUEUES"][message.queue]["max_attempts"]
    return "garbage" if message.attempt >= max_attempts else "retry"


@contextlib.contextmanager
def _recorded(message: Message, default: str) -> Iterator[tuple[str, str, int]]:
    """The call in the ledger: its start line as it begins, its end line however it ends
    (``BaseException`` and a cancelled coroutine too). Yields the action of this attempt (the
    payload's ``do``, else ``default``) split into its name and argument, and the start time."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    action = payload.get("do") or default
    if isinstance(action, list):
        action = action[min(message.attempt, len(action)) - 1]
    name, _, arg = action.partition(":")
    started = _ledger.record(message.id, message.due_ms, message.attempt, _KINDS.get(name, OK))
    try:
        yield name, arg, started
    finally:
        _ledger.finish(
            message.id,
            message.queue,
            message.attempt,
            started,
            message.due_ms,
            action,
            _expected_outcome(name, message),
            payload.get("gen"),
        )


@receiver([topic(name) for name in QUEUES])
def on_drill(sender: str, message: Message, **kwargs: Any) -> None:
    with _recorded(message, os.environ.get("DRILL_MODE", "ok")) as (name, arg, started):
        _act(name, arg, message, started)


# How the async receiver awaits its action in a thread (payload "via").
VIA: dict[str, Callable[[Callable[[], None]], Awaitable[None]]] = {
    "to_thread": lambda work: asyncio.to_thread(work),
    "executor": lambda work: asyncio.get_running_loop().run_in_executor(None, work),
    "sync_to_async": lambda work: sync_to_async(work, thread_sensitive=False)(),
    "sync_to_async_sensitive": lambda work: sync_to_async(work)(),
}


@receiver(topic(ASYNC_QUEUE))
async def on_drill_async(sender: str, message: Message, **kwargs: Any) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    with _recorded(message, "ok") as (name, arg, started):
        await VIA[payload.get("via", "to_thread")](
            functools.partial(_act_in_thread, name, arg, message, started)
        )


def _act_in_thread(name: str, arg: str, message: Message, started: int) -> None:
    """The async receiver's work, in the thread it awaits: the thread's start and end go to the
    ledger, for a cancelled coroutine ends before its thread (and one cancelled while its work
    still waited for an executor thread never runs it)."""
    _ledger.part("thread", message.id, message.attempt, started, ended=False)
    try:
        _act(name, arg, message, started)
    finally:
        _ledger.part("thread", message.id, message.attempt, started, ended=True)


def _act(name: str, arg: str, message: Message, started: int) -> None:
    if name == "raise":
        raise RuntimeError(f"drill: failing attempt {message.attempt}")
    if name == "exit":
        os._exit(3)
    if name == "sleep":
        time.sleep(float(arg))
    elif name == "block":
        reader, _writer = socket.socketpair()
        reader.recv(1)  # no timeout, and nothing ever written: blocked until the process ends
    elif name == "hold":
        _held.append(b"x" * int(float(arg) * 1024 * 1024))  # written: resident
    elif name == "systemexit":
        raise SystemExit(f"drill: SystemExit on attempt {message.attempt}")
    elif name == "baseexception":
        raise DrillBaseException(f"drill: BaseException on attempt {message.attempt}")
    elif name == "retry":
        raise dq.Retry(delay=float(arg), reason=f"drill: retry in {arg}s")
    elif name == "badretry":
        error = dq.Retry(reason=f"drill: bad delay {arg}")
        error.delay = float(arg)  # past Retry's own check: the consumer must still cope
        raise error
    elif name == "reject":
        raise dq.Reject(f"drill: rejected on attempt {message.attempt}")
    elif name == "gil":
        time.sleep(1)
        # PyDLL: a C function called without releasing the GIL (ctypes.CDLL would release it).
        ctypes.PyDLL(None).sleep(int(arg))
    elif name == "gilgo":
        go = os.environ["DRILL_LEDGER"] + ".go"
        while not os.path.exists(go):
            time.sleep(0.02)
        ctypes.PyDLL(None).sleep(int(arg))
    elif name == "program":
        with subprocess.Popen(["sleep", arg]) as program:
            with open(os.environ["DRILL_LEDGER"] + ".programs", "a") as pids:
                pids.write(f"{program.pid}\n")
            _ledger.part("program", message.id, message.attempt, started, program.pid, ended=False)
            program.wait()
        _ledger.part("program", message.id, message.attempt, started, program.pid, ended=True)
    elif name == "spin":
        end = time.monotonic() + float(arg)
        while time.monotonic() < end:
            pass
