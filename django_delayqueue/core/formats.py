"""Which envelope formats the live consumers of a queue read, as their heartbeats announce.

Each consumer announces the newest envelope format it reads with its heartbeat (``reads_format``
in its details: core.consumer.rounds.details). A consumer of a release before formats had numbers
announces none: it reads format 1, and dead-letters an envelope of a newer one (a consumer of
this release or later leaves it for a consumer that reads it). So a producer about to write a
feature of a newer format may hold it back until every live consumer reads it
(:class:`FormatGate`), and the system check and the health probe name the consumers older
than the producers (django_delayqueue.checks.formats, monitoring.health). docs/upgrades.md.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_delayqueue.core.envelope import to_str, validate_format
from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import redis_errors

logger = logging.getLogger(__name__)

# What a consumer that announces no format reads: one of a release before formats had numbers.
UNANNOUNCED_FORMAT = 1


def announced_format(details: Any) -> int:
    """The format a consumer's heartbeat details (its JSON, as stored) announce: 1 when they
    announce none or cannot be read (a consumer of a release before formats had numbers, or
    of one before heartbeats had details)."""
    if details is None:
        return UNANNOUNCED_FORMAT
    try:
        value = json.loads(to_str(details)).get("reads_format")
    except (ValueError, TypeError, AttributeError):
        return UNANNOUNCED_FORMAT
    return format_said(value)


def format_said(value: Any) -> int:
    """The format a heartbeat's ``reads_format`` value says: 1 for none or one that is not a
    format number. A format newer than this release knows is a newer consumer's: kept."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return UNANNOUNCED_FORMAT
    return value


def live_formats(queues: Sequence[Queue], alive_since_ms: int) -> dict[str, int]:
    """The newest format each consumer that beat on ``queues`` (a queue's shards: one client)
    since ``alive_since_ms`` reads, by consumer name: one round trip. A consumer on several
    shards counts once (with the lowest it announced). DelayQueueError if Redis fails."""
    if not queues:
        return {}
    pipe = queues[0].client.pipeline(transaction=False)
    for q in queues:
        pipe.zrangebyscore(q.keys.heartbeats, alive_since_ms, "+inf")
        pipe.hgetall(q.keys.consumer_details)
    with redis_errors("consumer heartbeats"):
        replies = pipe.execute()
    formats: dict[str, int] = {}
    for names, details in zip(replies[::2], replies[1::2], strict=True):
        said = {to_str(k): v for k, v in details.items()}
        for raw in names:
            name = to_str(raw)
            format = announced_format(said.get(name))
            formats[name] = min(format, formats.get(name, format))
    return formats


class FormatGate:
    """Whether every live consumer of a queue reads an envelope format: what a producer asks
    before it writes a feature of a format newer than some consumers may read.

    ``all_read(n)`` is true when at least one consumer beat on ``queues`` (a queue, or its
    shards) within ``alive_seconds`` and none of them reads less than ``n``: with no live
    consumer a newer feature is held back too (the next to start may be an old one). The
    heartbeats are read at most once per ``refresh_seconds`` (one round trip), so a producer
    may ask on every message. Redis unreachable: held back (False), said at debug level.
    Thread-safe. A consumer that starts after the last read is not known until the next
    one: it leaves what it cannot read for a consumer that reads it (nothing is lost).
    """

    def __init__(
        self,
        queues: Sequence[Queue],
        *,
        alive_seconds: float = 30.0,
        refresh_seconds: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not queues:
            raise DelayQueueError("a format gate needs at least one queue")
        self.queues = list(queues)
        self.alive_ms = int(alive_seconds * 1000)
        self.refresh_seconds = refresh_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._lowest: int | None = None  # the lowest format a live consumer reads; None: none
        self._read_at: float | None = None

    def all_read(self, format: int) -> bool:
        """Whether a message of ``format`` may be written now (see the class)."""
        validate_format(format)
        lowest = self.lowest()
        return lowest is not None and lowest >= format

    def lowest(self) -> int | None:
        """The lowest format a live consumer reads (None: no live consumer, or not read)."""
        with self._lock:
            now = self._monotonic()
            if self._read_at is None or now - self._read_at >= self.refresh_seconds:
                self._read_at = now
                self._lowest = self._read()
            return self._lowest

    def _read(self) -> int | None:
        try:
            since = self.queues[0].clock.now_ms() - self.alive_ms
            formats = live_formats(self.queues, since)
        except DelayQueueError as e:
            logger.debug("consumers' formats not read (newer features held back): %s", e)
            return None
        return min(formats.values(), default=None)
