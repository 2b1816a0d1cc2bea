"""The watchdog: time limits and aborts enforced on a consumer's running deliveries, threads and
coroutines alike.

One thread of its own that sleeps until the next thing to do (a soft or hard limit, the end of
an abort's grace, the end of a stop's wait), so limits are kept to the millisecond without
polling while nothing has one; it never talks to Redis (the aborts are read by
:class:`AbortPoller`, :mod:`.limits.aborts`). Nothing on the coroutines' event loop can keep
their time (one that blocks the loop in sync code stops every timer on it), so this thread keeps
theirs too. For each run (:mod:`.limits.runs`), whatever runs it (how it is told is its Run's:
an exception raised in its thread, or its stopper: a coroutine's soft limit raised on its loop,
its stop a cancel):

- past ``soft_time_limit``: ``SoftTimeLimitExceeded`` raised in it, once;
- past ``time_limit``: ``TimeLimitExceeded`` raised in it (a coroutine cancelled); its outcome is
  a retry with ``time_limit_reason`` (whatever it did after);
- an abort learnt, and ``abort_grace_seconds`` over: ``Aborted`` raised in it; its message goes
  to the dead letters with ``abort_reason``. The abort wins over a limit that comes in its
  grace: the soft limit is not raised after it, and the time limit ends the grace there, with
  the abort's stop (``Aborted``, dead letters), so that the handler, the log, the journal, the
  dead letters and a task's record all tell of the abort;
- still running its stop wait after a stop (:data:`STOP_WAIT_SECONDS` for a thread, blocked in
  C: a socket read, a sleep; its run's ``stop_wait_seconds`` for a coroutine, one that catches
  ``CancelledError``, blocks the loop, or whose threads still run): unstoppable.
  ``on_unstoppable`` gets its Run (the consumer then gives up on it, calls
  ``replacement_needed`` on its loop thread and stops).

``also`` is looked at with the runs, each time: the coroutines' event loop's liveness (its ping
and the "blocked loop" warning, :mod:`.handlers.loop_liveness`), which says when to look again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from django_delayqueue.core.consumer.handlers.contracts import RunningHandler
from django_delayqueue.core.consumer.limits.runs import Run, Runs
from django_delayqueue.core.consumer.limits.stopped import abort_reason, stop_at_time_limit
from django_delayqueue.core.errors import Aborted, SoftTimeLimitExceeded, TimeLimitExceeded
from django_delayqueue.core.observability.log_fields import message_fields
from django_delayqueue.core.settings import QueueSettings

logger = logging.getLogger(__name__)

# How long a stopped handler thread gets to end before it counts as unstoppable: a handler
# running Python gets the exception within the interpreter's switch interval (5 ms). A run
# with a stop wait of its own (``Run.stop_wait_seconds``: a coroutine's, which ends through its
# event loop) gets that instead (see handlers/coroutines.py: STOP_WAIT_SECONDS).
STOP_WAIT_SECONDS = 0.5
IDLE_WAIT_SECONDS = 1.0  # the longest sleep (a run that started meanwhile pokes it anyway)


class Watchdog:
    """Enforces ``settings_of(queue name)``'s limits on ``runs``, on a thread of its own
    (:meth:`start`) or one :meth:`check` at a time (tests, with their own clock).

    ``running`` (``Consumer.running_handlers``) says which handler threads still run their
    message: a thread's run that is not among them has ended (its thread is past the handler
    even if a stop landing at the very end kept it from leaving its run), and is left alone.
    Any other run (a coroutine's) runs for as long as it is among ``runs``: its runner ends it
    with its delivery.
    """

    def __init__(
        self,
        runs: Runs,
        settings_of: Callable[[str], QueueSettings | None],
        on_unstoppable: Callable[[Run], None],
        monotonic: Callable[[], float] | None = None,
        running: Callable[[], list[RunningHandler]] | None = None,
        also: Callable[[float], float] | None = None,
    ) -> None:
        self.runs = runs
        self._running = running
        self._settings_of = settings_of
        self._on_unstoppable = on_unstoppable
        # The runs' clock unless told (their start is timed on it), read as it is used.
        self._monotonic = monotonic or (lambda: runs.monotonic())
        self._also = also
        self._wake = threading.Event()
        self._wake_at = 0.0  # when the thread looks next (it sleeps until then)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="delayqueue-watchdog", daemon=True)
        self._thread.start()
        return self

    def poke(self) -> None:
        """Look again now (an abort was learnt)."""
        self._wake.set()

    def due_by(self, at: float) -> None:
        """Something is due at ``at`` (a run's first limit): look then, if not sooner. Costs a
        wake-up only when the thread would sleep past it (not for every run that starts)."""
        if at < self._wake_at:
            self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                next_at = self.check()
            except Exception:  # a bug here must not end the watchdog
                logger.exception("the watchdog's check failed")
                next_at = self._monotonic() + IDLE_WAIT_SECONDS
            wait = min(IDLE_WAIT_SECONDS, max(0.0, next_at - self._monotonic()))
            self._wake_at = self._monotonic() + wait
            self._wake.wait(wait)
            self._wake.clear()

    def check(self) -> float:
        """Act on every run that is due; returns when (``monotonic``) to look again."""
        now = self._monotonic()
        self._watch_limited()
        next_at = math.inf if self._also is None else self._also(now)
        runs = self.runs.all()
        if not runs:
            return next_at
        live = None
        if self._running is not None:
            live = {(r.message.queue, r.message.token) for r in self._running()}
        for run in runs:
            key = (run.message.queue, run.message.token)
            if live is not None and run.stopper is None and key not in live:
                continue  # its thread is past its handler
            settings = self._settings_of(run.message.queue)
            if settings is None:
                continue
            next_at = min(next_at, self._check_run(run, settings, now))
        return next_at

    def _watch_limited(self) -> None:
        """Handlers running without a Run on a queue that now has a time limit (set while they
        ran): they get one, timed from their start (Runs.adopt)."""
        since = None
        for slot, message in self.runs.unwatched():
            s = self._settings_of(message.queue)
            if s is None or not (s.time_limit or s.soft_time_limit):
                continue
            if since is None:  # since when each runs, noted by the handler threads
                running = self._running() if self._running is not None else []
                since = {(r.message.queue, r.message.token): r.started_monotonic for r in running}
            started = since.get((message.queue, message.token), self._monotonic())
            self.runs.adopt(slot, message, started)

    def _check_run(self, run: Run, s: QueueSettings, now: float) -> float:
        if not run.inside or run.unstoppable:
            return math.inf
        stop = run.stop
        if stop is not None:  # stopped: did it end?
            ends_by = stop.sent_at + _stop_wait(run)
            if now < ends_by:
                return ends_by
            run.unstoppable = True
            self._on_unstoppable(run)
            return math.inf
        elapsed = now - run.started_monotonic
        if run.abort_reason is not None and run.abort_seen_at is not None:
            return self._check_aborted(run, s, now, elapsed)
        due = math.inf
        if s.time_limit is not None:
            if elapsed >= s.time_limit:
                settlement, reason = stop_at_time_limit(run.message, s.time_limit, None)
                run.send_stop(settlement, reason, TimeLimitExceeded, now)
                return now + _stop_wait(run)
            due = min(due, run.started_monotonic + s.time_limit)
        soft = s.soft_time_limit
        if soft is not None and not run.soft_sent:
            if elapsed >= soft:
                run.soft_sent = True
                run.send(SoftTimeLimitExceeded, f"soft time limit exceeded ({soft:g} s)")
            else:
                due = min(due, run.started_monotonic + soft)
        return due

    def _check_aborted(self, run: Run, s: QueueSettings, now: float, elapsed: float) -> float:
        """An aborted run: stopped as aborted at the end of its grace, or at its time limit if
        that comes first."""
        assert run.abort_reason is not None and run.abort_seen_at is not None
        grace_ends = run.abort_seen_at + s.abort_grace_seconds
        limit = s.time_limit
        limit_at = math.inf if limit is None else run.started_monotonic + limit
        soft = s.soft_time_limit
        if soft is not None and elapsed >= soft:
            run.soft_sent = True  # its time came in the grace: never raised (the abort asked)
        if now < min(grace_ends, limit_at):
            return min(grace_ends, limit_at)
        if limit is not None and limit_at <= grace_ends:
            settlement, reason = stop_at_time_limit(run.message, limit, run.abort_reason)
        else:
            logger.warning(
                "queue %s: message %s aborted and still running after %gs: stopping it",
                run.message.queue,
                run.message.id,
                s.abort_grace_seconds,
                extra=message_fields(run.message),
            )
            settlement, reason = "dead", abort_reason(run.abort_reason)
        run.send_stop(settlement, reason, Aborted, now)
        return now + _stop_wait(run)


def _stop_wait(run: Run) -> float:
    """How long ``run``'s stop may take: its own (a coroutine's), else a thread's."""
    wait = run.stop_wait_seconds
    return STOP_WAIT_SECONDS if wait is None else wait
