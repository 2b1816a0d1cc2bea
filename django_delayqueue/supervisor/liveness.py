"""A consumer process proves it is alive, and says how long its supervisor may wait for it.

Why: the watchdog that stops a handler past its time limit and the extender that renews the
leases of running messages are threads of the consumer process. A handler stuck in a C call
that holds the GIL (a catastrophic ``re.match``, some C extensions) stops every thread of its
process: the handler is never stopped, its lease is never renewed and ends, and another process
delivers its message again while the first run goes on. Only another process can act then.

So a consumer process runs a :class:`Heartbeat`, a thread that sends :data:`.protocol.ALIVE`
over its pipe every fraction of a second. A GIL held for long silences it, as it silences the
watchdog and the extender. Each beat says how long the supervisor may wait for the next one
(``within``), the least of:

- :data:`IDLE_SILENCE_SECONDS`, far above any bound below: a process that holds nothing may
  be busy as long as it likes (a handler of a queue with hour-long leases may hold the GIL for
  a minute), and is killed only when it could harm a delivery;
- for each queue it consumes: the least that is left of a lease of that queue while its
  extender runs (the visibility timeout, less one renewal interval and one tick), less
  :data:`LEASE_MARGIN_SECONDS`. Every queue it consumes, not only those it holds messages of
  now: it may claim one the instant after the beat, and be stuck the instant after that. So
  the supervisor kills a silent process before any lease it holds can end, and its messages
  are never delivered elsewhere while it lives;
- for each running handler with a ``time_limit`` that was not stopped yet, the time left until
  it, plus :data:`LIMIT_MARGIN_SECONDS` (the watchdog's stop and its half second, or a
  coroutine's second, and the report to the supervisor): a process that should have stopped it
  or reported it by then and is silent is stuck. Only the handlers running now: the time limit
  of a queue that runs nothing says nothing of a handler of another queue (one that starts
  after the beat and is stuck at once is still bounded by its lease);

and never less than :data:`SHORTEST_SILENCE_SECONDS` (a healthy process beats four times within
it, and a process whose threads stall that long is in trouble anyway). Below a visibility
timeout of about 5 s that floor is longer than a lease may have left: the supervisor still
kills a stuck process, but its message may have been delivered again a moment before.

A beat also carries the running handlers when they changed since the last one (:class:`Held`),
so that the supervisor, having killed a silent process and reaped it, settles their messages as
it settles a handler a process could not stop (:meth:`Held.stopped_handler`): retried (the
attempt counts; with "time limit exceeded" once past the limit) or dead-lettered (an abort). A
message whose token is no longer current is left alone. A handler that started after the last
beat comes back after its visibility timeout, the attempt counted (it may be the GIL holder
itself, which must never come back uncharged), as does a finished outcome not yet recorded.
What the process claimed and never started (held ahead of a busy thread, waiting for its due
time, a coroutine its stuck loop never began) it marked in memory the supervisor reads once it
is reaped (:mod:`.start_marks`; each mark cleared before its handler is called): given back at
once with no attempt used (release.lua), a delivery a beat also named running included.

The supervisor's side is in :mod:`.loop` (``Supervisor._kill_silent``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from django_delayqueue.core.consumer.limits.extender import SHORTEST_INTERVAL_SECONDS, TICK_SECONDS
from django_delayqueue.core.consumer.limits.stopped import (
    Settlement,
    StoppedHandler,
    abort_reason,
    time_limit_reason,
)
from django_delayqueue.supervisor.protocol import ALIVE, ChildChannel

logger = logging.getLogger(__name__)

IDLE_SILENCE_SECONDS = 3600.0  # a bound for a process with nothing to protect (no queue)
SHORTEST_SILENCE_SECONDS = 2.0  # the shortest wait a beat asks for
LEASE_MARGIN_SECONDS = 1.0  # killed this long before the earliest lease it holds may end
LIMIT_MARGIN_SECONDS = 2.0  # past a time limit, the watchdog's stop and its report
# A beat every quarter of the wait it asks for, within these bounds.
SHORTEST_PERIOD_SECONDS = 0.1
LONGEST_PERIOD_SECONDS = 1.0


def silence_reason(seconds: float) -> str:
    """The reason a message whose process was killed for its silence is retried with."""
    return f"its consumer process stopped answering ({seconds:.1f} s) and was killed"


@dataclass(frozen=True)
class Held:
    """A handler running in a consumer process, as its heartbeat tells the supervisor."""

    queue: str  # physical
    message_id: str
    token: str
    attempt: int
    task: bool = False
    abort: str | None = None  # the abort's reason, once learnt
    time_limit: float | None = None
    limit_in: float | None = None  # seconds from the beat to its time limit (< 0: passed)
    stopped: bool = False  # a stop was sent (it ended, or it is reported as unstoppable)

    def key(self) -> tuple[Any, ...]:
        """What a change of makes the heartbeat send the running handlers again."""
        return (self.queue, self.token, self.abort, self.time_limit, self.stopped)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Held:
        """From a beat, maybe of another release (a fresh interpreter after SIGHUP runs the
        code on disk): a field this release does not know is left out; ValueError when one it
        needs is missing or of the wrong type (the caller skips that entry)."""
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        try:
            held = cls(**known)
        except TypeError as e:
            raise ValueError(f"a running handler this supervisor cannot read: {data!r}") from e
        if not all(isinstance(v, str) for v in (held.queue, held.message_id, held.token)):
            raise ValueError(f"a running handler this supervisor cannot read: {data!r}")
        return held

    def stopped_handler(self, past_limit: bool, silent_seconds: float) -> StoppedHandler:
        """How its message is settled once its silent process was killed and reaped."""
        settlement: Settlement
        if self.abort is not None:
            settlement, reason = "dead", abort_reason(self.abort)
        elif past_limit and self.time_limit is not None:
            settlement, reason = "retry", time_limit_reason(self.time_limit)
        else:
            settlement, reason = "retry", silence_reason(silent_seconds)
        return StoppedHandler(
            self.queue,
            self.message_id,
            self.token,
            self.attempt,
            settlement,
            reason,
            self.task,
        )


def answer_within(queues: Iterable[QueueLimits], running: Iterable[Held]) -> tuple[float, str]:
    """Seconds the supervisor may wait for the next beat (see module doc), and what bounds it."""
    within, why = IDLE_SILENCE_SECONDS, "a silent process"
    for q in queues:
        seconds = q.visibility_timeout
        renewal = max(SHORTEST_INTERVAL_SECONDS, seconds / 3)
        left = seconds - renewal - TICK_SECONDS - LEASE_MARGIN_SECONDS
        if left < within:
            within, why = left, f"a lease of queue {q.name} ({seconds:g} s visibility timeout)"
    for held in running:
        if held.limit_in is None or held.stopped:
            continue
        left = held.limit_in + LIMIT_MARGIN_SECONDS
        if left < within:
            within = left
            why = f"the time limit of message {held.message_id} ({held.time_limit:g} s)"
    return max(SHORTEST_SILENCE_SECONDS, within), why


def beat_period(within: float) -> float:
    """Seconds between two beats that ask for ``within``."""
    return min(LONGEST_PERIOD_SECONDS, max(SHORTEST_PERIOD_SECONDS, within / 4))


@dataclass(frozen=True)
class QueueLimits:
    """What bounds a consumer process's silence on one queue it consumes (its settings now)."""

    name: str
    visibility_timeout: float
    time_limit: float | None = None


@dataclass(frozen=True)
class Holding:
    """What a consumer process consumes and runs now."""

    queues: Sequence[QueueLimits]
    running: Sequence[Held]


class Heartbeat:
    """The thread that sends ALIVE beats (see module doc); ``read`` says what the process holds
    now (called on the heartbeat's thread)."""

    def __init__(
        self,
        channel: ChildChannel,
        read: Callable[[], Holding],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._channel = channel
        self._read = read
        self._monotonic = monotonic
        self._sent_running: list[tuple[Any, ...]] | None = None
        self._failed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="delayqueue-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        period = 0.0
        while not self._stop.wait(period):
            period = self.beat()

    def beat(self) -> float:
        """Send one beat; returns the seconds until the next."""
        try:
            holding = self._read()
        except Exception:  # a bug here must not end the beats (the process would be killed)
            if not self._failed:
                logger.exception("the heartbeat could not read what this process holds")
            self._failed = True
            self._channel.offer(ALIVE, within=SHORTEST_SILENCE_SECONDS, why="unknown")
            return beat_period(SHORTEST_SILENCE_SECONDS)
        within, why = answer_within(holding.queues, holding.running)
        fields: dict[str, Any] = {"within": round(within, 3), "why": why}
        keys = [h.key() for h in holding.running]
        if keys != self._sent_running:
            fields["running"] = [h.to_json() for h in holding.running]
        # Offered, never waited for: a beat never holds up the loop thread's messages (a full
        # pipe drops it; the next beat, a period later, says the same and more).
        if self._channel.offer(ALIVE, **fields) and "running" in fields:
            self._sent_running = keys
        return beat_period(within)
