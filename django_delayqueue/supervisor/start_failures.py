"""Consumer processes that die before they consume, again and again: said once, and shown.

A child that cannot start for a reason that will not go away by itself (a client it cannot use,
a settings module that fails to import after a deploy, a server it cannot reach) dies, is
replaced, and dies again, with the backoff of :mod:`.backoff` between tries. Its log would
repeat the same traceback for ever, and nothing outside the log would say why the queue is
not consumed. So the supervisor:

- logs a child's exception (sent over its pipe as it dies) in full once per distinct error, and
  one line for each later death of the same error;
- once a slot's child has died before consuming :data:`REPORT_AFTER` times in a row, publishes
  "consumers keep dying at start: <error>" under its own name in one hash
  (:func:`~django_delayqueue.core.keys.start_failures_key`), refreshed at each death and removed
  when a child of that supervisor consumes or the supervisor stops. The stats (admin,
  ``queuestats``, metrics) and the health probe read it (monitoring.start_failures).

Publishing goes through the supervisor's settling client (short timeouts, no retries): a Redis
it cannot reach costs the loop at most that client's timeout, and is itself what the health
probe reports then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from django_delayqueue.core.errors import DelayQueueError
from django_delayqueue.core.keys import start_failures_key
from django_delayqueue.monitoring.start_failures import StartFailure

logger = logging.getLogger(__name__)

# Deaths before consuming, in a row in one slot, before the failure is published.
REPORT_AFTER = 2


@dataclass
class StartFailures:
    """The supervisor's record of children that died before they consumed (see module doc).

    ``client`` gives the supervisor's settling client (called only when something must be
    written); ``now_ms`` reads the wall clock in ms (injectable in tests)."""

    supervisor: str
    queues: Sequence[str] | None
    prefix: str
    client: Callable[[], Any]
    now_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    _in_a_row: dict[int, int] = field(default_factory=dict)  # slot -> deaths before consuming
    _logged: set[str] = field(default_factory=set)  # the errors logged in full
    _published: StartFailure | None = None

    def failed(self, error: str, details: str | None) -> None:
        """A child ended on the exception it reported (``error`` in one line, ``details`` its
        traceback), whenever it did (at start, while serving, while stopping): logged in full
        the first time, one line after that."""
        if error not in self._logged:
            self._logged.add(error)
            logger.error("consumer process failed: %s\n%s", error, (details or "").rstrip())
        else:
            logger.error("consumer process failed again: %s (traceback logged before)", error)

    def died(self, slot: int, consumed: bool, error: str) -> None:
        """A child of ``slot`` died (``consumed``: after it consumed) of ``error``."""
        if consumed:
            self.consumed(slot)  # its start worked; another slot may still fail at start
            return
        self._in_a_row[slot] = self._in_a_row.get(slot, 0) + 1
        if self._in_a_row[slot] >= REPORT_AFTER:
            if self._published is None or self._published.error != error:
                logger.error(
                    "consumer processes keep dying at start (%d in a row): %s",
                    self._in_a_row[slot],
                    error,
                )
            self._update(error, deaths=max(self._in_a_row.values()))

    def consumed(self, slot: int) -> None:
        """A child of ``slot`` consumes: its start works (again)."""
        self._in_a_row[slot] = 0
        if not any(self._in_a_row.values()):
            self._update(None)

    def stopped(self) -> None:
        """The supervisor stops: nothing of it stays published."""
        self._in_a_row.clear()
        self._update(None)

    @property
    def published(self) -> StartFailure | None:
        return self._published

    def _update(self, error: str | None, deaths: int = 0) -> None:
        if error is None and self._published is None:
            return
        now = self.now_ms()
        key = start_failures_key(self.prefix)
        try:
            client = self.client()
            if error is None:
                client.hdel(key, self.supervisor)
                self._published = None
                return
            since = self._published.since_ms if self._published else now
            entry = StartFailure(
                supervisor=self.supervisor,
                queues=None if self.queues is None else list(self.queues),
                error=error,
                deaths=deaths,
                since_ms=since,
                at_ms=now,
            )
            client.hset(key, self.supervisor, entry.to_json())
            self._published = entry
        except (redis.RedisError, DelayQueueError, OSError) as e:
            logger.debug("start failures not published: %s", e)
