"""Each queue's handler threads, and the messages claimed for them.

A consumer gives every queue its own handler threads (its ``concurrency``), so a queue whose
handlers are slow keeps only its own messages waiting, never another queue's. The loop thread claims
for a queue only what its threads have room for (:meth:`HandlerThreads.room`): one message per idle
thread, plus what they finish during two refills at their handlers' measured pace
(:mod:`.rounds.claim_ahead`: a claim batch for quick handlers, one or two for 20 ms ones, none for
slow ones, whose held messages would only wait here instead of on another consumer's idle thread).

The threads know two things of the consumer: what runs a message (a :class:`Deliverer`: the
consumer) and how to wake its loop (a :class:`LoopWaker`: the consumer's waiter), which they
nudge when a finished handler is worth a round trip. Those terms, and the
:class:`RunningHandler` the threads report, are in :mod:`.handlers.contracts`; the consumer
holds every queue's threads in a :class:`.handlers.threads_by_queue.ThreadsByQueue`.

Messages are tracked by their delivery token: tokens come from a per-queue counter, and every
``HandlerThreads`` holds one queue's messages, so a token is unique within it (queue A's token "1"
and queue B's token "1" live in different objects).

Handlers run on daemon threads so that a forced exit is not held up by a stuck handler (whose
message is brought back by its visibility timeout).

A message whose handler is a coroutine (``Coroutines.runs_async``) takes no thread: it runs on
the consumer's event loop (:mod:`.handlers.coroutines`), counted against the same ``size`` as a
running thread, with the same bookkeeping (claimed, running, finished, abandoned). Threads are
therefore started as sync messages need them, up to ``size``: a queue of coroutines with a
concurrency of 500 keeps one thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from threading import get_ident
from time import monotonic

from django_delayqueue.core.consumer.handlers.contracts import (
    Coroutines,
    Deliverer,
    LoopWaker,
    RunningHandler,
)
from django_delayqueue.core.consumer.outcomes import RETRY, Outcome
from django_delayqueue.core.consumer.rounds.claim_ahead import ClaimAhead
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.observability.log_fields import message_fields

logger = logging.getLogger(__name__)

JOIN_SECONDS = 1.0  # how long close() waits for the idle threads to end
# While claimed messages wait for a quick queue's threads, outcomes ride with the next claim;
# none waits longer than this to be recorded.
RECORD_WITHIN_SECONDS = 0.1


class HandlerThreads:
    """The handler threads of one queue and the messages claimed for them."""

    def __init__(
        self,
        queue_name: str,
        size: int,
        deliverer: Deliverer,
        waker: LoopWaker,
        coroutines: Coroutines | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic``: the loop's clock (seconds), which times its refills (see
        :meth:`refilled`)."""
        self.queue_name = queue_name
        self._deliverer = deliverer
        self._waker = waker
        self._coroutines = coroutines
        self._claimed: deque[Message] = deque()  # claimed, not started yet
        self._async: set[str] = set()  # tokens among _claimed that run on the event loop
        self._running: dict[str, Message] = {}  # by token
        # By token, while its handler runs: (message, since (monotonic), thread ident, whether
        # a coroutine), a RunningHandler once asked for (running()).
        self._since: dict[str, tuple[Message, float, int, bool]] = {}
        self._finished: list[Outcome] = []  # not yet taken by the loop
        # Given up on at a stop while their handler ran, by token: still extended (see
        # abandoned()) until their handler ends, so they are never delivered beside it.
        self._abandoned: dict[str, Message] = {}
        self._cond = threading.Condition()
        self._size = 0
        self._threads: list[threading.Thread] = []
        self._working: set[threading.Thread] = set()  # threads inside a handler
        self._holding = False  # stopping: start nothing more
        self._closed = False
        # How many to hold ahead of a free thread (rounds/claim_ahead.py): fed with each handler's
        # run and with how long the loop took to refill after these threads asked it to.
        self._ahead = ClaimAhead()
        self._monotonic = monotonic
        self._asked_at: float | None = None  # when these threads asked the loop for more
        self.claim_batch = 1  # the queue's claim_batch, as the loop last told room()
        self._first_finished_at: float | None = None  # oldest outcome the loop has not taken
        self._serial = 0
        self.resize(size)

    # --- the loop thread's side -----------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    def resize(self, size: int) -> None:
        """Use ``size`` threads from now on (a setting edited in the admin); threads follow."""
        size = max(1, int(size))
        with self._cond:
            if self._closed or size == self._size:
                return
            self._size = size
            self._threads = [t for t in self._threads if t.is_alive()]
            self._grow()
            self._start_coroutines()
            self._cond.notify_all()  # threads beyond the new size see it and end

    def _grow(self) -> None:
        """Start the threads the sync messages waiting need, up to ``size`` (one at least)."""
        waiting = len(self._claimed) - len(self._async)
        wanted = min(self._size, max(1, len(self._working) + waiting))
        for _ in range(wanted - len(self._threads)):
            self._serial += 1
            thread = threading.Thread(
                target=self._serve,
                name=f"delayqueue-{self.queue_name}-{self._serial}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def _start_coroutines(self) -> None:
        """Start the coroutines waiting, while running handlers leave room (under _cond)."""
        coroutines = self._coroutines
        if not self._async or coroutines is None or self._holding or self._closed:
            return
        for message in list(self._claimed):
            if len(self._running) >= self._size:
                return
            if message.token not in self._async:
                continue
            self._claimed.remove(message)
            self._async.discard(message.token)
            self._running[message.token] = message
            started_monotonic, started_ms = time.monotonic(), int(time.time() * 1000)
            try:
                ident = coroutines.start(message, self._finish)
            except Exception as e:  # the loop is closed (a stop): a failed attempt, recorded
                logger.exception(
                    "message %s: coroutine not started", message.id, extra=message_fields(message)
                )
                self._running.pop(message.token, None)
                reason = f"coroutine not started: {e!r}"
                self._finished.append(Outcome(message, RETRY, started_ms, started_ms, None, reason))
                if self._first_finished_at is None:
                    self._first_finished_at = started_monotonic
                continue
            self._since[message.token] = (message, started_monotonic, ident, True)

    def room(self, claim_batch: int | None = None) -> int:
        """How many more messages the loop may claim for these threads now."""
        with self._cond:
            if claim_batch is not None:
                self.claim_batch = claim_batch
            return self._room()

    def _room(self) -> int:
        if self._holding or self._closed:
            return 0
        ahead = self._ahead.count(self._size, self.claim_batch)
        held = len(self._claimed) + len(self._running)
        free = self._size + ahead - held
        # Holding many ahead, claim in batches of at least half of them (or when the threads
        # would otherwise run dry), not a message or two per round trip.
        if self._claimed and free < ahead // 2:
            return 0
        return max(0, free)

    def refilled(self, round_started: float | None) -> None:
        """The loop's round that started at ``round_started`` (its clock) has handed these
        threads what it claimed: if they had asked for more before it started, that is how
        long a refill takes. None: the round failed (Redis down, then a backoff): a request
        it leaves unanswered is dropped, not timed (an outage is no refill's pace)."""
        with self._cond:
            asked_at = self._asked_at
            if asked_at is None:
                return
            if round_started is None:
                self._asked_at = None
            elif asked_at <= round_started:  # else it is the next round that answers
                self._asked_at = None
                self._ahead.refilled(self._monotonic() - asked_at)

    def add(self, messages: list[Message]) -> None:
        coroutines = self._coroutines
        on_loop: list[str] = []
        if coroutines is not None and self._deliverer.may_run_async():
            # Asked before taking the lock: telling may import a task's module the first time.
            on_loop = [m.token for m in messages if coroutines.runs_async(m)]
        with self._cond:
            self._claimed.extend(messages)
            if on_loop:
                self._async.update(on_loop)
                self._start_coroutines()
            self._grow()
            self._cond.notify(len(messages))

    def take_finished(self) -> list[Outcome]:
        with self._cond:
            finished, self._finished = self._finished, []
            self._first_finished_at = None
            return finished

    def take_unstarted(self) -> list[Message]:
        """Remove and return what was claimed but not started (to give it back)."""
        with self._cond:
            unstarted = list(self._claimed)
            self._claimed.clear()
            self._async.clear()
            return unstarted

    def hold(self) -> None:
        """Start nothing more (a stop was asked for): running handlers go on."""
        with self._cond:
            self._holding = True
            self._cond.notify_all()

    def in_flight(self) -> list[Message]:
        """Claimed, running and finished-but-untaken messages: their deadlines must move out.

        A finished message stays in unack until its outcome is recorded; were it not extended
        meanwhile, a reap could deliver a message whose handler succeeded a second time. An
        abandoned one (a stop gave up on its running handler) is extended from the moment it is
        abandoned: the shutdown's last writes may take seconds before Extender.linger starts.
        """
        with self._cond:
            finished = [o.message for o in self._finished]
            running = list(self._running.values()) + list(self._abandoned.values())
            return list(self._claimed) + running + finished

    def finished_and_abandoned(self) -> tuple[list[Outcome], list[Message]]:
        """The untaken outcomes, and the running messages, given up on, at one instant.

        The running ones are no longer held: their outcomes, if their handlers ever finish,
        are dropped; until then :meth:`abandoned` lists them. Read apart, a handler finishing
        in between would be in neither list.
        """
        with self._cond:
            finished, self._finished = self._finished, []
            self._first_finished_at = None
            running = list(self._running.values())
            for m in running:
                self._abandoned[m.token] = m
            self._running.clear()
            return finished, running

    def abandon(self, token: str) -> None:
        """Give up on the running handler of ``token`` (it could not be stopped): as at a stop,
        its outcome is dropped should it come, and it stays extended while it runs."""
        with self._cond:
            message = self._running.pop(token, None)
            if message is not None:
                self._abandoned[token] = message

    def running(self) -> list[RunningHandler]:
        """The handlers running now (given-up-on ones included), oldest first."""
        with self._cond:
            since = sorted(self._since.values(), key=lambda r: r[1])
        now_ms, now = time.time() * 1000, time.monotonic()
        return [
            RunningHandler(m, started, int(now_ms - (now - started) * 1000), ident, coroutine=c)
            for m, started, ident, c in since
        ]

    def abandoned(self) -> list[Message]:
        """The messages given up on at a stop whose handler still runs: their deadlines must
        still move out, or a reap would deliver them again beside it."""
        with self._cond:
            return list(self._abandoned.values())

    def record_due_in(self) -> float | None:
        """Seconds until the oldest untaken outcome must be recorded; None if there is none."""
        with self._cond:
            if self._first_finished_at is None:
                return None
            elapsed = time.monotonic() - self._first_finished_at
            return max(0.0, RECORD_WITHIN_SECONDS - elapsed)

    @property
    def busy(self) -> bool:
        """Anything claimed, running or finished and not yet taken."""
        with self._cond:
            return bool(self._claimed or self._running or self._finished)

    def close(self) -> None:
        """End the threads that are idle (waiting for a message); a running one ends after."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            # Not the threads still in a handler (left in flight at the end of the grace period):
            # waiting for them would only delay the exit; they are daemons and end with it.
            threads = [t for t in self._threads if t not in self._working]
        deadline = time.monotonic() + JOIN_SECONDS
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    # --- the handler threads' side --------------------------------------------------------------

    def _next(self, me: threading.Thread, ident: int) -> Message | None:
        """The next message for thread ``me`` (``ident``), or None when ``me`` must end."""
        with self._cond:
            while True:
                if self._closed or self._threads.index(me) >= self._size:
                    self._threads.remove(me)
                    if self._claimed:  # what it would have taken: another thread's
                        self._cond.notify()
                    return None
                if self._holding:
                    message = None
                elif self._async:
                    message = self._next_sync()
                else:  # _next_sync() without a call: no coroutine among the claimed
                    ready = self._claimed and len(self._running) < self._size
                    message = self._claimed.popleft() if ready else None
                if message is not None:
                    self._running[message.token] = message
                    # A tuple: made for every message under the lock (RunningHandler in
                    # running(), read seldom).
                    self._since[message.token] = (message, monotonic(), ident, False)
                    self._working.add(me)
                    return message
                self._cond.wait()

    def _next_sync(self) -> Message | None:
        """The first claimed message for a thread, if a running handler's room allows."""
        if not self._claimed or len(self._running) >= self._size:
            return None
        if not self._async:
            return self._claimed.popleft()
        for message in self._claimed:
            if message.token not in self._async:
                self._claimed.remove(message)
                return message
        return None

    def _serve(self) -> None:
        me, ident = threading.current_thread(), get_ident()
        while True:
            message = self._next(me, ident)
            if message is None:
                try:
                    self._deliverer.handler_thread_exit()
                except Exception:
                    logger.exception("handler thread cleanup failed")
                return
            try:
                outcome = self._deliverer.deliver(message)
            except BaseException as e:  # run_handler never raises; this guards the thread itself
                logger.exception(
                    "handler thread failed on message %s", message.id, extra=message_fields(message)
                )
                outcome = Outcome(message, RETRY, 0, 0, None, f"handler thread failed: {e!r}")
            self._finish(outcome, me)

    def _finish(self, outcome: Outcome, thread: threading.Thread | None = None) -> None:
        """A handler ended: on ``thread``, or (None) a coroutine on the event loop's thread."""
        if self._took_outcome(outcome, thread):
            return
        # Given up on: its outcome is never recorded, so its span (a failure's is left for the
        # recording, tracing.EndedLater) ends here, out of the lock (a processor may export).
        span, outcome.span = outcome.span, None
        if span is not None:
            span.end()

    def _took_outcome(self, outcome: Outcome, thread: threading.Thread | None) -> bool:
        """Take ``outcome`` to record (True), or drop it: its handler was given up on."""
        with self._cond:
            if thread is not None:
                self._working.discard(thread)
            token = outcome.message.token
            self._since.pop(token, None)
            if self._abandoned.pop(token, None) is not None:  # given up on at a stop: not
                return False  # ours to record; no longer extended, back after its timeout
            self._running.pop(token, None)
            if self._claimed:  # its room goes to the next waiting, coroutine or thread
                if self._async:
                    self._start_coroutines()
                # A thread takes the next itself (its _next): woken for a coroutine's room
                # only, not once per message (each wake-up costs the threads the GIL).
                if thread is None:
                    self._cond.notify()
            self._finished.append(outcome)
            now = time.monotonic()
            first = self._first_finished_at is None
            if self._first_finished_at is None:
                self._first_finished_at = now
            first_finished_at = self._first_finished_at
            self._ahead.handler_ran((outcome.finished_ms - outcome.started_ms) / 1000)
            # Wake the loop when a round trip is worth it: these threads may take more, or ran
            # dry, or an outcome has waited long enough. Not for every quick handler: a round
            # per message would cost more than the handlers.
            worth_a_round = (
                not self._claimed
                or self._room() > 0
                or now - first_finished_at >= RECORD_WITHIN_SECONDS
            )
            if worth_a_round and self._asked_at is None:
                self._asked_at = self._monotonic()  # timed until the round that answers
        if worth_a_round:
            self._waker.nudge()
        elif first:  # recorded with a claim, or by this time
            self._waker.remind(now + RECORD_WITHIN_SECONDS)
        return True
