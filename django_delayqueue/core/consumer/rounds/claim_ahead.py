"""How many messages a queue's handler threads hold claimed ahead of a free thread.

A message claimed ahead starts the moment a thread frees, instead of one refill later (the
thread asks the loop for more, the loop wakes, its round trip claims): with quick handlers that
refill is a real share of the time. But a message held here is one that no other consumer can
run, so what a process holds ahead is sized by time, not by a flat batch: as many as its
threads finish during two refills, at their handlers' measured pace (the threads ask for more
once half of what they hold is left, see ``HandlerThreads._room``: that half must last one
refill). A no-op handler then holds
a claim batch (hundreds: round trips are most of the cost), a 20 ms one holds one or two, and N
processes share a backlog evenly instead of the first to wake taking it all (as Celery's
prefetch does without ``-O fair``). Handlers whose run dwarfs the refill hold none: a thread
idles for a refill now and then, and a message never waits behind a busy thread here while
another consumer's thread is free.
"""

from __future__ import annotations

import math

# How much one measurement moves its average (an exponentially weighted mean).
WEIGHT = 0.2
# Until a refill has been measured: about one round trip to a Redis nearby.
FIRST_REFILL_SECONDS = 0.002
# Held ahead: what the threads finish during this many refills (see the module's docstring).
REFILLS_HELD = 2
# One slow run moves the handlers' mean to at most twice itself plus this: quick handlers
# measure a millisecond or more now and then (their thread waited for the GIL while the loop
# read a claim, or the host descheduled it), and the mean must not drop what they hold ahead
# for the dozens of runs after each. A lasting change of pace still shows within some 30 runs.
RISE_AT_MOST_SECONDS = 0.0001
# Hold none while a refill takes less than this share of one handler's run: a thread idling
# for it costs the queue less than that, and held messages would wait on this consumer's busy
# threads while another's may be free.
HOLD_NONE_UNDER_SHARE = 0.02


class ClaimAhead:
    """The measured pace of one queue's handlers and of its refills, and what to hold ahead.

    Fed by the queue's handler threads: :meth:`handler_ran` as each handler ends, with how
    long it ran; :meth:`refilled` as the loop's round ends, with how long the threads waited
    since they asked it for more (the wake, the round trip, handing the messages over).
    """

    def __init__(self) -> None:
        self.handler_seconds: float | None = None  # mean run of one handler
        self.refill_seconds: float | None = None  # mean wait from asking to claimed

    def handler_ran(self, seconds: float) -> None:
        mean = self.handler_seconds
        if mean is not None:
            seconds = min(seconds, 2 * mean + RISE_AT_MOST_SECONDS)
        self.handler_seconds = _moved(mean, max(0.0, seconds))

    def refilled(self, seconds: float) -> None:
        self.refill_seconds = _moved(self.refill_seconds, max(0.0, seconds))

    def count(self, threads: int, claim_batch: int) -> int:
        """How many messages ``threads`` threads should hold claimed beyond one each: what
        they finish during two refills, rounded up; at most ``claim_batch`` (what one round
        claims), none before a handler has been measured."""
        run = self.handler_seconds
        if run is None or claim_batch <= 0:
            return 0
        refill = FIRST_REFILL_SECONDS if self.refill_seconds is None else self.refill_seconds
        if refill < HOLD_NONE_UNDER_SHARE * run:
            return 0
        # Compared before dividing: handlers quicker than the clock reads (a mean of 0 ms
        # outcomes, or one that decays toward 0 without reaching it) would divide to infinity.
        finished = REFILLS_HELD * threads * refill
        if finished >= claim_batch * run:
            return claim_batch
        return math.ceil(finished / run)


def _moved(mean: float | None, sample: float) -> float:
    return sample if mean is None else mean + WEIGHT * (sample - mean)
