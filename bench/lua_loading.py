"""Two ways to ship the Lua, measured on the hot path: EVALSHA of each rendered script (what the
library does) against one Redis Functions library (``FUNCTION LOAD`` + ``FCALL``) holding the
same rendered text, with a raw ``ZADD`` as the floor. Issue 12 asked for both to be measured
before choosing; the figures and the choice are in docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.contracts import PROMOTE, SCHEDULE
from django_delayqueue.core.scripts.loader import render

from .harness import Bench, Row, interleave
from .sizes import Sizes

LIBRARY = "dqbench"
NOW = 1_700_000_000_000


def function_library(names: list[str]) -> str:
    """The scripts as one Functions library: each rendered text becomes one function's body."""
    parts = [f"#!lua name={LIBRARY}"]
    for name in names:
        parts.append(f"local function {name}(KEYS, ARGV)\n{render(name)}\nend")
        parts.append(f"redis.register_function('dq_{name}', {name})")
    return "\n".join(parts)


def _schedule_keys(queue: str) -> list[str]:
    return SCHEDULE.keys_for(QueueKeys("bench", queue))


def _promote_keys(queue: str) -> list[str]:
    return PROMOTE.keys_for(QueueKeys("bench", queue))


def _evalsha(client: redis.Redis, name: str, queue: str, count: int) -> Callable[[int], int]:
    script = LuaScript.named(name)
    client.script_load(script.source)
    return _calls(client, ("EVALSHA", script.sha), name, queue, count)


def _fcall(client: redis.Redis, name: str, queue: str, count: int) -> Callable[[int], int]:
    return _calls(client, ("FCALL", f"dq_{name}"), name, queue, count)


def _calls(
    client: redis.Redis, head: tuple[str, str], name: str, queue: str, count: int
) -> Callable[[int], int]:
    keys = _schedule_keys(queue) if name == "schedule" else _promote_keys(queue)

    def work(r: int) -> int:
        run = client.execute_command
        for i in range(r * count, (r + 1) * count):
            if name == "schedule":  # a new message due in an hour, one call each
                args = [NOW, 2000, "bench:wake", f"m{i}", NOW + 3_600_000 + i, "e"]
            else:  # the idle poll: nothing due
                args = [NOW, 100]
            run(*head, len(keys), *keys, *args)
        return count

    return work


def _zadd(client: redis.Redis, count: int) -> Callable[[int], int]:
    def work(r: int) -> int:
        for i in range(r * count, (r + 1) * count):
            client.zadd("bench:raw-zadd", {f"m{i}": NOW + i})
        return count

    return work


def lua_loading(bench: Bench, sizes: Sizes) -> list[Row]:
    client = bench.client
    version = str(client.info("server").get("redis_version", "0"))
    if int(version.split(".")[0]) < 7:
        return [Row("lua.functions", f"Redis {version} has no Functions", None, "calls/s")]
    client.execute_command("FUNCTION", "LOAD", "REPLACE", function_library(["schedule", "promote"]))
    count = max(1, sizes.schedule_one // sizes.schedule_rounds)
    rows = []
    for name, what in (("schedule", "schedule one message"), ("promote", "idle promote poll")):
        result = interleave(
            sizes.schedule_rounds,
            _fcall(client, name, f"fcall-{name}", count),
            _evalsha(client, name, f"evalsha-{name}", count),
            _zadd(client, count),
        )
        fcall, evalsha, zadd = result.rates
        rows.append(
            Row(
                f"lua.{name}",
                f"{what}: FCALL of a Functions library",
                fcall,
                "calls/s",
                evalsha,
                "EVALSHA of the rendered script (what the library sends)",
                result.ratio,
                note=f"raw ZADD, one at a time: {zadd:,.0f}/s",
                extra={"raw_zadd_per_s": zadd, "rounds": result.rounds},
            )
        )
    client.execute_command("FUNCTION", "DELETE", LIBRARY)
    bench.flush()
    return rows
