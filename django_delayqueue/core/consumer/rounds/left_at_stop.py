"""What is left to record when the consumer stops, tried for a bounded time and number of tries.

An outcome recorded may hand over a write of its own: a task whose record was gone is written
whole once its ack has landed (``write_soon``); a failure's journal row goes once its nack has
replied. So a pass that sent any call of an outcome is followed by another at once, not counted
as a try: a write queued by the ack of the last try is sent all the same (its message is acked,
the write is the task's only result). Still bounded: each such pass sends at least one of the
outcomes' calls, and no new outcome comes in at a stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
from django_delayqueue.core.errors import DelayQueueError

logger = logging.getLogger(__name__)

RECORD_RETRY_PAUSE_SECONDS = 0.2  # between two tries to record what is left at shutdown


def record_left(
    outcomes: UnrecordedOutcomes,
    record_once: Callable[[], None],
    seconds: float,
    monotonic: Callable[[], float],
) -> None:
    """Run ``record_once`` (one pass over every server; raises DelayQueueError) until nothing
    of ``outcomes`` is left, for ``seconds`` at most with a pause between tries; log what is
    still left, outcomes (delivered again) apart from handed-over writes (lost)."""
    deadline = monotonic() + seconds
    # Bounded in tries as well: an injected clock that stands still must not loop for ever.
    tries = max(1, round(seconds / RECORD_RETRY_PAUSE_SECONDS))
    while outcomes and monotonic() < deadline and tries > 0:
        before = outcomes.unsent()
        try:
            record_once()
        except DelayQueueError as e:
            logger.warning("could not record outcomes on shutdown: %s", e)
        if outcomes.unsent() < before:
            # Outcomes recorded: what their acks handed over, and the journal rows of failures
            # (sent once their nacks replied), go at once.
            continue
        tries -= 1
        if outcomes:
            time.sleep(RECORD_RETRY_PAUSE_SECONDS)
    outcomes.end_spans()  # of failures whose nacks never replied: ended as they were
    not_recorded, not_written = outcomes.left()
    if not_recorded:
        logger.warning(
            "%d outcome(s) not recorded: those messages will be delivered again", not_recorded
        )
    if not_written:
        logger.warning(
            "%d write(s) handed over by handlers not sent (a task's state or result record): lost",
            not_written,
        )
