"""The supervising loop: N consumer processes, replaced when they die, recycled, stopped.

One process, one thread: it starts the children (:mod:`.starting`: forked, running
:mod:`.child`; after a SIGHUP, fresh interpreters of the code on disk), then waits on their
pipes and on a self-pipe its signal handlers write to (``signal.set_wakeup_fd``), like
gunicorn's arbiter.
It holds no thread and no open connection when it forks (Django's database connections and the
Redis pool are closed first), so a child starts clean.

Each slot (``--processes N`` of them) has a serving child, and while it is being replaced a
successor. A replacement (recycling, SIGHUP) starts the successor first and tells the old child
to stop only once the successor says it consumes (``ready``): no gap in service. A child that
dies is replaced at once, with backoff when it keeps dying soon after its start (ready or not).
A child that could not stop a handler (a time limit) is replaced at once, and the messages of
the handlers it could not stop are settled only once it has exited and been reaped: a stopped
handler never runs beside its own redelivery. After a SIGHUP, such a replacement is a fresh
interpreter; when none can start (new code that fails to load), a fork of the supervisor's code
stands in, so that a stuck handler never holds its queue until the code is fixed.

The supervisor is the last line of defence (:mod:`.liveness`): a child that has not said it is
alive within what its last heartbeat asked for (well before the shortest lease it holds can
end, or a time limit its watchdog should have enforced) is stuck where no thread of its own can
act, say in a C call that holds the GIL. It is killed with SIGKILL, and once it is reaped the
messages its handlers ran are settled as for a handler it could not stop. Every child leads a
process group, killed whenever the child is killed and once it is reaped (:mod:`.groups`): the
programs its handlers started end with it.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import threading
import time
from collections import deque
from typing import Any

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.core.consumer.loop import FORCED_FLUSH_SECONDS, SHUTDOWN_FLUSH_SECONDS
from django_delayqueue.supervisor.child import (
    SUPERVISOR_SIGNALS,
    SupervisedWorker,
)
from django_delayqueue.supervisor.children import (
    Child,
    Slot,
    SupervisorOptions,
    describe_exit,
    kill,
    send_signal,
)
from django_delayqueue.supervisor.groups import kill_group
from django_delayqueue.supervisor.liveness import SHORTEST_SILENCE_SECONDS, Held
from django_delayqueue.supervisor.protocol import ALIVE, FAILED, FATAL, READY, RECYCLE, STOPPED
from django_delayqueue.supervisor.settling import (
    close_connections,
    give_back,
    settle,
    settling_client,
)
from django_delayqueue.supervisor.start_failures import StartFailures
from django_delayqueue.supervisor.start_marks import Unstarted
from django_delayqueue.supervisor.starting import ChildStarter

logger = logging.getLogger(__name__)

KILL_MARGIN_SECONDS = 5.0  # past a child's own deadline (grace + last writes) before SIGKILL
TICK_SECONDS = 1.0  # the longest wait of the loop with nothing happening
# While Redis is down, the messages of stopped handlers are tried again this often (each try
# costs the loop at most the settling client's timeout: supervisor.settling).
SETTLE_RETRY_SECONDS = 5.0


class Supervisor:
    """Runs ``options.processes`` consumer processes until SIGTERM/SIGINT (see module doc).

    :meth:`run` returns the exit code: 0 when every child stopped cleanly, 1 when one did not
    (it failed to stop, or was killed past its grace), or the code of a configuration error a
    child reported (``fatal`` says what), which stops every child. A child being replaced for a
    handler it could not stop, or killed for its silence, is no failure of the stop: its end
    was decided before (as a child that died and was replaced while runqueue ran); nor is one
    that could not start (it died of an error it reported, before it consumed).
    """

    def __init__(
        self, options: SupervisorOptions, worker_class: type[SupervisedWorker] = SupervisedWorker
    ) -> None:
        self.options = options
        self.worker_class = worker_class
        self.pid = os.getpid()
        self.name = options.name or f"runqueue-{socket.gethostname()}-{self.pid}"
        self.starter = ChildStarter(options, self.name, self.pid, worker_class)
        self.slots = [Slot(i) for i in range(options.processes)]
        self.retiring: list[Child] = []  # told to stop (or stopping by themselves)
        self.to_settle: list[StoppedHandler] = []  # their process is gone; Redis was down
        self.to_give_back: list[Unstarted] = []  # claimed, never started; process gone
        self._settle_at = 0.0  # time.monotonic() of the next try at to_settle
        self.stop_requests = 0
        self.fatal: tuple[str, int] | None = None
        self.failed = False  # a child did not stop cleanly at the end
        self._rolling: deque[int] = deque()  # slots SIGHUP still has to replace
        # Since the first SIGHUP, every child is a fresh interpreter (the code on disk).
        self.fresh_children = False
        self._signals: deque[int] = deque()
        self._wake_r, self._wake_w = -1, -1
        from django_delayqueue.conf.settings import dq_settings

        self.start_failures = StartFailures(
            self.name, options.queues, str(dq_settings.PREFIX), client=settling_client
        )

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        if threading.active_count() > 1:
            logger.warning(
                "%d threads run in the supervisor before it forks: a child inherits only the "
                "forking one, and any lock another held",
                threading.active_count() - 1,
            )
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        previous = self._install_signals()
        try:
            logger.info("supervisor %s: %d consumer process(es)", self.name, self.options.processes)
            while not self._finished():
                self._take_signals()
                self._reap()
                self._settle_left()
                if not self.stop_requests:
                    self._roll()
                    self._fill_slots()
                self._kill_overdue()
                self._kill_silent()
                if self._finished():
                    break
                self._wait(self._timeout())
        finally:
            self._restore_signals(previous)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        self._settle_left(final=True)
        self.start_failures.stopped()
        if self.fatal is not None:
            return self.fatal[1]
        logger.info("supervisor %s stopped", self.name)
        return 1 if self.failed else 0

    def _finished(self) -> bool:
        return self.stop_requests > 0 and not self._children()

    def _children(self) -> list[Child]:
        children = [c for s in self.slots for c in (s.current, s.successor) if c is not None]
        return children + self.retiring

    def _timeout(self) -> float:
        now = time.monotonic()
        times = [c.kill_at for c in self._children() if c.kill_at is not None]
        times += [c.answer_by for c in self._children() if c.answer_by is not None]
        if not self.stop_requests:
            times += [s.not_before for s in self.slots if s.current is None and s.successor is None]
        if self.to_settle or self.to_give_back:
            times.append(self._settle_at)
        return max(0.0, min([now + TICK_SECONDS, *times]) - now)

    def _wait(self, timeout: float) -> None:
        readers = {c.reader.fd: c for c in self._children() if not c.reader.closed}
        try:
            ready, _, _ = select.select([self._wake_r, *readers], [], [], timeout)
        except InterruptedError:
            return
        for fd in ready:
            if fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            child = readers[fd]
            for message in child.reader.read():
                self._on_message(child, message)

    # --- signals ----------------------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {s: signal.getsignal(s) for s in SUPERVISOR_SIGNALS}
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        signal.set_wakeup_fd(self._previous_wakeup)
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals.append(signum)  # only a flag: the loop acts (woken by the wakeup fd)

    def _take_signals(self) -> None:
        while self._signals:
            signum = self._signals.popleft()
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.request_stop()
            elif signum == signal.SIGHUP and not self.stop_requests:
                self._rolling = deque(s.index for s in self.slots)
                if self.options.restart is not None:
                    self.fresh_children = True
                    logger.info(
                        "SIGHUP: replacing the consumer processes one by one, with the code "
                        "on disk (%s)",
                        " ".join(self.options.restart.argv),
                    )
                else:
                    logger.warning(
                        "SIGHUP: replacing the consumer processes one by one, forked with the "
                        "code loaded at start: this runqueue was not started from a command "
                        "line that runs it again (call_command), so new code needs a restart"
                    )

    def request_stop(self) -> None:
        """First: every child stops gracefully (within --grace). Second: at once."""
        self.stop_requests += 1
        now = time.monotonic()
        if self.stop_requests == 1:
            logger.info("stopping %d consumer process(es) gracefully", len(self._children()))
            for child in self._children():
                self._tell_to_stop(child)
        else:
            logger.warning("stopping the consumer processes at once")
            deadline = now + FORCED_FLUSH_SECONDS + KILL_MARGIN_SECONDS
            for child in self._children():
                send_signal(child, signal.SIGUSR1)
                child.kill_at = min(child.kill_at or deadline, deadline)

    # --- children ---------------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> Child:
        # The supervisor's own pipes, which a forked child closes.
        open_fds = [self._wake_r, self._wake_w]
        open_fds += [c.reader.fd for c in self._children() if c.reader.fd >= 0]
        open_fds += [
            c.marks.fd for c in self._children() if c.marks is not None and c.marks.fd >= 0
        ]
        fresh = self.fresh_children
        stand_in = fresh and slot.fresh_failed is not None and (slot.stuck or slot.current is None)
        if stand_in:
            logger.warning(
                "%s, and no fresh interpreter can start (%s): forking one from the code this "
                "supervisor loaded at its start instead, until the code on disk loads",
                f"consumer process {slot.current.pid} must be replaced (a handler it could not "
                "stop)"
                if slot.current is not None
                else f"slot {slot.index + 1} has no consumer process",
                slot.fresh_failed,
            )
        try:
            child = self.starter.start(slot, fresh=fresh and not stand_in, open_fds=open_fds)
        except OSError as e:
            if fresh and not stand_in:  # the interpreter cannot be run: a stand-in next
                slot.fresh_failed = f"{type(e).__name__}: {e}"
            raise
        child.stand_in = stand_in
        return child

    def _fill_slots(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if now < slot.not_before or self.fatal is not None:
                continue
            try:
                if slot.current is None and slot.successor is None:
                    slot.current = self._spawn(slot)
                elif slot.replace_wanted and slot.successor is None and slot.current is not None:
                    logger.info(
                        "replacing consumer process %d: %s",
                        slot.current.pid,
                        slot.replace_wanted,
                    )
                    slot.successor = self._spawn(slot)
            except OSError as e:  # fork refused (EAGAIN, ENOMEM): try again later
                slot.not_before = now + slot.backoff.died(0) + 1.0
                if slot.stuck and slot.fresh_failed is not None and self.fresh_children:
                    slot.not_before = now  # an interpreter that cannot run: a stand-in now
                logger.error("could not start a consumer process: %s", e)

    def _roll(self) -> None:
        """SIGHUP: one slot at a time wants a replacement, until every slot had its own."""
        if self._rolling and not any(s.replace_wanted for s in self.slots):
            slot = self.slots[self._rolling[0]]
            if slot.current is None:  # being refilled anyway: a fresh process
                self._rolling.popleft()
            else:
                slot.replace_wanted = "SIGHUP"

    def _on_message(self, child: Child, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        slot = self.slots[child.slot]
        if kind == ALIVE:
            self._heard(child, message)
        elif kind == READY:
            # (The crash-loop backoff is not reset here: a forked child says it consumes before
            # its first handler runs, and one that kills its process is no less a crash loop.)
            child.ready = True
            self.start_failures.consumed(child.slot)
            if child.process is not None:
                slot.fresh_failed = None  # fresh interpreters start again
            if slot.current is child:  # filled an empty slot
                slot.stuck = False
                if child.stand_in and not slot.replace_wanted:
                    slot.replace_wanted = "to run the code on disk"
            if slot.successor is child:
                old, slot.current, slot.successor = slot.current, child, None
                slot.stuck = False
                if child.stand_in:
                    # Still to be replaced by the code on disk, tried with the backoff of
                    # the interpreters that failed: a SIGHUP's turn stays with this slot.
                    if slot.replace_wanted != "SIGHUP":
                        slot.replace_wanted = "to run the code on disk"
                else:
                    if slot.replace_wanted == "SIGHUP" and self._rolling:
                        self._rolling.popleft()
                    slot.replace_wanted = None
                if old is not None:
                    logger.info("consumer process %d consumes: stopping %d", child.pid, old.pid)
                    self._retire(old)
                if self.stop_requests:
                    self._tell_to_stop(child)
        elif kind == RECYCLE:
            if slot.current is child and not slot.replace_wanted:
                slot.replace_wanted = str(message.get("reason") or "recycling")
                if message.get("memory"):
                    self._pace_memory_recycling(slot, child)
        elif kind == STOPPED:
            handlers = []
            for entry in message.get("handlers") or []:
                try:  # a fresh interpreter runs the code on disk: maybe another release
                    handlers.append(StoppedHandler.from_json(entry))
                except (ValueError, TypeError) as e:
                    logger.error(
                        "consumer process %d: a stopped handler this supervisor cannot read "
                        "(%s): its message comes back after its visibility timeout",
                        child.pid,
                        e,
                    )
            child.note_stopped(handlers, reported=True)
            if child.killed:  # its end was decided before: replaced once it is reaped
                logger.warning(
                    "consumer process %d could not stop %d handler(s): settled once it is gone",
                    child.pid,
                    len(handlers),
                )
                return
            logger.warning(
                "consumer process %d could not stop %d handler(s): replacing it now",
                child.pid,
                len(handlers),
            )
            # Replaced as when recycled: it serves on until its successor consumes, then it is
            # told to stop (its other handlers finish); the stopped ones are settled once it is
            # gone. No gap for its other queues.
            if slot.current is child:
                slot.stuck = True
            if slot.current is child and slot.successor is None:
                slot.replace_wanted = "a handler could not be stopped"
                slot.not_before = 0.0
                if not self.stop_requests:
                    self._fill_slots()
            elif slot.current is not child:  # already on its way out: it stops anyway
                self._tell_to_stop(child)
        elif kind == FAILED:
            child.error = str(message.get("error") or "") or None
            child.error_details = str(message.get("traceback") or "") or None
        elif kind == FATAL:
            text = str(message.get("message") or "configuration error")
            code = int(message.get("code") or 1)
            if self.fatal is None:
                self.fatal = (text, code)
                logger.error("consumer process %d: %s; stopping", child.pid, text)
                if not self.stop_requests:
                    self.request_stop()

    def _pace_memory_recycling(self, slot: Slot, child: Child) -> None:
        """A process that outgrew --max-memory-per-child soon after its start, again and again,
        is followed by one as large: replaced at once, the slot would fork as fast as processes
        start. Its successor starts after the crash-loop backoff (0.5 s doubling to 30 s) from
        the second such process on; it serves until then, so its queues have no gap."""
        lived = time.monotonic() - child.started
        delay = slot.memory_backoff.died(lived)
        if not delay:
            return
        slot.not_before = max(slot.not_before, time.monotonic() + delay)
        logger.warning(
            "consumer process %d outgrew --max-memory-per-child %.1fs after its start, as "
            "the process before it did: a fresh process is about as large, so it is replaced "
            "in %.1fs, not at once (it serves until then); give --max-memory-per-child more "
            "than a fresh consumer process's resident memory",
            child.pid,
            lived,
            delay,
        )

    def _retire(self, child: Child) -> None:
        self.retiring.append(child)
        self._tell_to_stop(child)

    def _tell_to_stop(self, child: Child) -> None:
        if not child.told_to_stop:
            child.told_to_stop = True
            send_signal(child, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_seconds()
        child.kill_at = deadline if child.kill_at is None else min(child.kill_at, deadline)

    def _stop_seconds(self) -> float:
        return self.options.grace_seconds + SHUTDOWN_FLUSH_SECONDS + KILL_MARGIN_SECONDS

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for child in self._children():
            if child.kill_at is not None and now >= child.kill_at and not child.killed:
                logger.warning("consumer process %d did not stop in time: SIGKILL", child.pid)
                child.killed = True
                kill(child)

    def _heard(self, child: Child, message: dict[str, Any]) -> None:
        """A heartbeat of ``child`` (supervisor.liveness): hear from it again within what it
        asks for, or kill it."""
        now = time.monotonic()
        try:
            within = float(message.get("within") or 0.0)
        except (TypeError, ValueError):
            within = 0.0
        if not within < float("inf"):  # inf or NaN
            within = 0.0
        child.heard_at = now
        child.answer_by = now + max(SHORTEST_SILENCE_SECONDS, within)
        child.answer_why = str(message.get("why") or "")
        running = message.get("running")
        if isinstance(running, list):
            held = []
            for entry in running:
                try:  # a fresh interpreter runs the code on disk: maybe another release
                    held.append(Held.from_json(entry))
                except (ValueError, TypeError) as e:
                    logger.warning("consumer process %d: %s", child.pid, e)
            child.running = [(h, None if h.limit_in is None else now + h.limit_in) for h in held]

    def _kill_silent(self) -> None:
        """SIGKILL (with its group) every child that has not said it is alive in time: it is
        stuck where none of its threads can act (a C call that holds the GIL); its running
        messages are settled once it is reaped (``_gone``), never while it may still run."""
        for child in self._children():
            if child.answer_by is None or child.killed or child.reader.closed:
                continue
            if time.monotonic() < child.answer_by:
                continue
            # Its beats may be waiting in the pipe (this loop was busy): read them first.
            for message in child.reader.read():
                self._on_message(child, message)
            now = time.monotonic()
            if child.killed or child.reader.closed or now < child.answer_by:
                continue
            silent = now - child.heard_at
            known = {(s.queue, s.token) for s in child.stopped}
            settle = [
                held.stopped_handler(limit_at is not None and limit_at <= now, silent)
                for held, limit_at in child.running
                if (held.queue, held.token) not in known
            ]
            logger.error(
                "consumer process %d has not answered for %.1fs, longer than %s allows: it is "
                "stuck where its own threads cannot act (a C call that holds the GIL?). "
                "SIGKILL, with its process group; its %d running message(s) are settled once "
                "it is gone",
                child.pid,
                silent,
                child.answer_why or "its heartbeat",
                len(settle),
            )
            child.silent = silent
            child.killed = True
            child.note_stopped(settle, reported=False)
            kill(child)
            slot = self.slots[child.slot]
            if slot.current is child:
                slot.stuck = True

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = next((c for c in self._children() if c.pid == pid), None)
            if child is not None:
                self._gone(child, status)

    def _gone(self, child: Child, status: int) -> None:
        """``child`` exited and was reaped: kill what is left of its process group (programs
        its handlers started), settle what it could not stop, replace it."""
        kill_group(child.pid)
        for message in child.reader.read():  # what it said last
            self._on_message(child, message)
        child.reader.close()
        if child.error is not None:  # said whatever it was doing: starting, serving, stopping
            self.start_failures.failed(child.error, child.error_details)
        code = os.waitstatus_to_exitcode(status)
        if child.process is not None:  # reaped here: Popen must not wait for the pid again
            child.process.returncode = code
        slot = self.slots[child.slot]
        lived = time.monotonic() - child.started
        if child in self.retiring:
            self.retiring.remove(child)
        if slot.current is child:
            slot.current = None
        if slot.successor is child:
            slot.successor = None
        clean = code == 0 and not child.killed
        # What it claimed and never started (its start marks), given back with no attempt
        # used, whatever way it ended: it is gone, so none of them can start now. A delivery
        # its last heartbeat listed as running and still marked never reached its handler
        # (a coroutine its stuck loop never began, a thread waiting for its due time): given
        # back, not retried.
        unstarted = self._read_marks(child)
        marked = {(u.queue, u.token) for u in unstarted}
        self.to_give_back.extend(unstarted)
        self.to_settle.extend(s for s in child.stopped if (s.queue, s.token) not in marked)
        if self.to_settle or self.to_give_back:
            self._settle_left()
        slot.backoff.lived(lived)
        # A child being replaced (a handler it could not stop, or its silence) ends as decided
        # before the stop, and one that died of the error it reported before it consumed is a
        # start failure (logged, and published while they go on): neither fails the stop. A
        # fresh interpreter that died before it consumed is one too, reported or not: the code
        # on disk failed to load (a SyntaxError in django.setup() comes before any report).
        start_failed = not child.ready and not child.killed
        start_failed = start_failed and (child.error is not None or child.process is not None)
        failed = not clean and not child.replaced and not start_failed
        if child.told_to_stop:
            if not clean:
                logger.warning(
                    "consumer process %d stopped with %s%s%s",
                    child.pid,
                    describe_exit(code),
                    f": {child.error}" if child.error else "",
                    " (it was being replaced)" if child.replaced else "",
                )
                if self.stop_requests and failed:
                    self.failed = True
            else:
                logger.info("consumer process %d stopped", child.pid)
            return
        if self.stop_requests or self.fatal is not None:
            self.failed = self.failed or failed
            return
        delay = slot.backoff.died(lived)
        if _failed_to_load(child, code):
            slot.fresh_failed = child.error or describe_exit(code)
            if slot.stuck:  # its predecessor holds a stuck handler: a stand-in now
                delay = 0.0
        slot.not_before = time.monotonic() + delay
        logger.error(
            "consumer process %d died (%s%s) after %.1fs%s: %s",
            child.pid,
            describe_exit(code),
            f": {child.error}" if child.error else "",
            lived,
            "" if child.ready else ", before it consumed",
            f"replaced in {delay:.1f}s" if delay else "replaced now",
        )
        self.start_failures.died(
            child.slot,
            child.ready,
            child.error or f"{describe_exit(code)} (no exception reported)",
        )

    def _read_marks(self, child: Child) -> list[Unstarted]:
        """The start marks ``child`` left (it is reaped), its table closed."""
        if child.marks is None:
            return []
        try:
            return child.marks.read(child.pid)
        except OSError as e:  # left to their visibility timeout
            logger.warning("consumer process %d: start marks not read: %s", child.pid, e)
            return []
        finally:
            child.marks.close()

    def _settle_left(self, *, final: bool = False) -> None:
        """Give back what processes that are gone claimed and never started, and record the
        outcome of the stopped handlers: at once, then (Redis down) every
        SETTLE_RETRY_SECONDS, never holding the loop longer than one try; at the end
        (``final``) one last try, and what is still left is logged and left in flight."""
        if not (self.to_settle or self.to_give_back):
            return
        if not final and time.monotonic() < self._settle_at:
            return
        if self.to_give_back:
            self.to_give_back = give_back(self.to_give_back, final=final)
        if self.to_settle and (final or not self.to_give_back):  # Redis answered (or last try)
            self.to_settle = settle(self.to_settle, final=final)
        left = self.to_settle or self.to_give_back
        self._settle_at = time.monotonic() + SETTLE_RETRY_SECONDS if left else 0.0
        close_connections()


# Signals a process never sends itself: one that died of them before it consumed was killed (by
# an operator, the OOM killer, a test), not stopped by code that fails to load.
_KILLED_BY_OTHERS = {-signal.SIGKILL, -signal.SIGTERM}


def _failed_to_load(child: Child, code: int) -> bool:
    """Whether ``child``, which died before it consumed, is a fresh interpreter whose start
    failed on its own (an import error, a crash: the code on disk does not load), which makes
    the slot's next replacement of a stuck process a fork of the supervisor's code. One this
    supervisor killed (for its silence; a stop's kill is never asked here) or that someone else
    killed says nothing of the code on disk: it is replaced by a fresh interpreter again."""
    if child.process is None or child.ready or child.killed:
        return False
    return code not in _KILLED_BY_OTHERS
