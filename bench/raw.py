"""Raw redis-py baselines: what one connection does with no library in between.

These are the ceilings our figures are divided by. They use the same redis-py client, the same
connection settings and the same server as the library, in the same run.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.fast_path import BoundScript

# The "one-line script": store one id at one score, the least a delayed queue must do.
ONE_LINE_SCRIPT = "return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])"


class Raw:
    """Baseline workloads on their own keys (``raw:*``), each returning its operation count."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.sha = client.script_load(ONE_LINE_SCRIPT)
        self._next = 0

    def _ids(self, count: int) -> range:
        start = self._next
        self._next += count
        return range(start, start + count)

    def evalsha_one(self, count: int) -> Callable[[int], int]:
        """``count`` EVALSHA calls of the one-line script, one round trip each."""

        def work(_round: int) -> int:
            evalsha, sha = self.client.evalsha, self.sha
            for i in self._ids(count):
                evalsha(sha, 1, "raw:evalsha", 1_700_000_000_000 + i, f"m{i}")
            return count

        return work

    def evalsha_bound(self, count: int) -> Callable[[int], int]:
        """``count`` calls of the one-line script through :class:`BoundScript` (schedule()'s
        way of sending: encoded once, on a pooled connection, no ``execute_command``)."""
        script = LuaScript("raw", ONE_LINE_SCRIPT, self.sha)
        bound = BoundScript(script, self.client, ["raw:bound"], [])

        def work(_round: int) -> int:
            for i in self._ids(count):
                bound(1_700_000_000_000 + i, f"m{i}")
            return count

        return work

    def zadd_one(self, count: int) -> Callable[[int], int]:
        """``count`` ZADD calls, one round trip each."""

        def work(_round: int) -> int:
            zadd = self.client.zadd
            for i in self._ids(count):
                zadd("raw:zadd", {f"m{i}": 1_700_000_000_000 + i})
            return count

        return work

    def zadd_pipelined(self, count: int, batch: int) -> Callable[[int], int]:
        """``count`` ZADD calls sent ``batch`` per pipeline (no MULTI)."""

        def work(_round: int) -> int:
            ids = self._ids(count)
            for start in range(0, count, batch):
                pipe = self.client.pipeline(transaction=False)
                for i in ids[start : start + batch]:
                    pipe.zadd("raw:pipelined", {f"m{i}": 1_700_000_000_000 + i})
                pipe.execute()
            return count

        return work

    def clear(self) -> None:
        self.client.delete("raw:evalsha", "raw:zadd", "raw:pipelined", "raw:bound")
