"""Why consumer processes keep dying before they consume, as their supervisors publish it
(django_delayqueue.supervisor.start_failures), for the stats, the admin and the health probe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django_delayqueue.core.keys import start_failures_key

# The backoff between tries tops at 30 s (supervisor.backoff), and each death refreshes the
# entry: one not refreshed for this long belongs to a supervisor that is gone (killed).
STALE_SECONDS = 120.0


@dataclass
class StartFailure:
    """What one supervisor publishes: the error its children die of before consuming."""

    supervisor: str
    queues: list[str] | None  # None: every configured queue
    error: str
    deaths: int
    since_ms: int
    at_ms: int

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> StartFailure | None:
        try:
            data = json.loads(raw)
            return cls(
                supervisor=str(data["supervisor"]),
                queues=None if data["queues"] is None else [str(q) for q in data["queues"]],
                error=str(data["error"]),
                deaths=int(data["deaths"]),
                since_ms=int(data["since_ms"]),
                at_ms=int(data["at_ms"]),
            )
        except (ValueError, TypeError, KeyError):
            return None

    def covers(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    @property
    def message(self) -> str:
        return f"consumers keep dying at start: {self.error}"


def read_start_failures(client: Any, prefix: str, now_ms: int) -> list[StartFailure]:
    """The start failures published by live supervisors (stale ones left out)."""
    raw = client.hgetall(start_failures_key(prefix)) or {}
    found = [StartFailure.from_json(value) for value in raw.values()]
    fresh_after = now_ms - STALE_SECONDS * 1000
    return [f for f in found if f is not None and f.at_ms >= fresh_after]
