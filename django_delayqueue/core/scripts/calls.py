"""Loading the ``.lua`` files once and running them with EVALSHA.

Why not ``redis.Script`` in pipelines: redis-py sends ``SCRIPT EXISTS`` before every pipeline
that holds a script, which doubles the round trips of the consumer's hot path. Here a pipeline
sends EVALSHA only; the rare NOSCRIPT (after ``SCRIPT FLUSH`` or a restart) loads the script and
re-runs just the calls that failed, which is safe because a call that got NOSCRIPT did nothing.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import redis

from django_delayqueue.core.errors import RedisUnavailable, ScriptFailed

_NOSCRIPT = "NOSCRIPT"

# "-- KEYS[3] ready list" in a script's header: the Redis type each key must have.
_KEY_TYPE = re.compile(r"KEYS\[(\d+)\]\s+\S+\s+(zset|list|hash|counter|stream)\b")
_REDIS_TYPE = {"counter": "string"}

# Redis does not roll a script back when a command fails half-way: a claim whose unack key
# had been overwritten by a string would have popped ids from ready and lost them. So each
# script calls guard() on the keys it is about to write before its first write, and changes
# nothing if one holds the wrong type. A key whose type an earlier command of the script already
# proved (a read, or the first write itself) needs no check: that is what keeps an idle poll at
# a couple of commands. tests/test_core_key_types.py breaks every key under every operation.
# No tables: guard(i) runs on hot paths (a schedule() of one message), where allocating them
# cost as much as the TYPE call itself.
_GUARD = """local function guard(...)
  local count = select('#', ...)
  for n = 1, count == 0 and %d or count do
    local i = count == 0 and n or select(n, ...)
    local expected = %s
    if expected then
      local actual = redis.call('TYPE', KEYS[i])['ok']
      if actual ~= 'none' and actual ~= expected then
        error({err = 'WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. actual .. ', not a ' ..
          expected .. ': nothing was changed'})
      end
    end
  end
end
"""


def guarded(source: str) -> str:
    """``source`` preceded by ``guard(i, ...)``, which checks the key types its header declares.

    ``guard()`` with no index checks every declared key.
    """
    header = "\n".join(line for line in source.splitlines() if line.startswith("--"))
    types = {int(n): _REDIS_TYPE.get(t, t) for n, t in _KEY_TYPE.findall(header)}
    if not types or not re.search(r"^\s*guard\(|[^\w.]guard\(", source, re.MULTILINE):
        return source
    expected = " or ".join(f"i == {n} and '{t}'" for n, t in sorted(types.items()))
    return _GUARD % (max(types), f"{expected} or nil") + source


# A function in lua/_shared.lua: from "local function name(" to the first unindented "end".
_SHARED_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end$", re.MULTILINE | re.DOTALL)


def _read_lua(name: str) -> str:
    return resources.files("django_delayqueue.core.scripts.lua").joinpath(f"{name}.lua").read_text()


def script_names() -> list[str]:
    """The names of every script, sorted (``_shared.lua`` holds functions only: not one)."""
    return sorted(
        f.name.removesuffix(".lua")
        for f in resources.files("django_delayqueue.core.scripts.lua").iterdir()
        if f.name.endswith(".lua") and not f.name.startswith("_")
    )


@cache
def _shared_functions() -> dict[str, str]:
    return {m[1]: m[0] for m in _SHARED_FUNCTION.finditer(_read_lua("_shared"))}


def with_shared_functions(source: str) -> str:
    """``source`` preceded by the functions of ``_shared.lua`` that it calls.

    Redis runs each script on its own (no ``require``), so a function two scripts need is kept
    once in ``_shared.lua`` and copied in front of each script that calls it, with the shared
    functions it calls in turn. They keep the file's order: a local function must be defined
    before the one that calls it.
    """
    shared = _shared_functions()
    text = "\n".join(line for line in source.splitlines() if not line.startswith("--"))
    used: set[str] = set()
    while True:
        calls = {name for name in shared if name not in used and _calls(text, name)}
        if not calls:
            break
        used |= calls
        text = "\n".join(shared[name] for name in calls)
    ordered = [body for name, body in shared.items() if name in used]
    return "\n".join([*ordered, source]) if ordered else source


def _calls(text: str, name: str) -> bool:
    """Whether Lua ``text`` calls ``name`` (not merely a longer name ending in it)."""
    return re.search(rf"(?<![\w.]){name}\(", text) is not None


@dataclass(frozen=True)
class LuaScript:
    name: str
    source: str
    sha: str

    @classmethod
    @cache
    def named(cls, name: str) -> LuaScript:
        source = guarded(with_shared_functions(_read_lua(name)))
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script now, loading it if Redis does not know it."""
        with redis_errors(self.name):
            try:
                return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                client.script_load(self.source)
                return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


@dataclass
class ScriptBatch:
    """Several script calls sent in one pipeline (one round trip)."""

    calls: list[tuple[LuaScript, Sequence[str], Sequence[Any]]] = field(default_factory=list)

    def add(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> int:
        self.calls.append((script, keys, args))
        return len(self.calls) - 1

    def run(self, client: Any, raise_errors: bool = True) -> list[Any]:
        """Send every call in one pipeline; script errors are raised, or returned in place."""
        if not self.calls:
            return []
        with redis_errors("pipeline"):
            _load_once(client, {script for script, _, _ in self.calls})
            results = _send(client, self.calls)
            missing = [i for i, r in enumerate(results) if is_noscript(r)]
            if missing:
                for script in {self.calls[i][0] for i in missing}:
                    client.script_load(script.source)
                retried = _send(client, [self.calls[i] for i in missing])
                for i, result in zip(missing, retried, strict=False):
                    results[i] = result
        for (script, _, _), result in zip(self.calls, results, strict=False):
            if isinstance(result, Exception) and raise_errors:
                raise ScriptFailed(f"{script.name}.lua failed: {result}") from result
        return results


# Scripts already loaded through each client. Loading before the first pipelined use keeps
# the calls of a pipeline in order: a NOSCRIPT re-run would run after the calls that followed
# it. After a SCRIPT FLUSH or a restart the re-run below is the (rare, still safe) fallback.
_loaded: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _load_once(client: Any, scripts: set[LuaScript]) -> None:
    try:
        known = _loaded.setdefault(client, set())
    except TypeError:  # a client that cannot be weakly referenced: rely on the fallback
        return
    for script in scripts:
        if script.sha not in known:
            client.script_load(script.source)
            known.add(script.sha)


def _send(client: Any, calls: list[tuple[LuaScript, Sequence[str], Sequence[Any]]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        # Not pipe.evalsha(): redis-py's cluster pipeline refuses that method, but routes the
        # plain command by its first key (all keys of a queue share one slot).
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    return pipe.execute(raise_on_error=False)


def is_noscript(result: Any) -> bool:
    return isinstance(result, redis.exceptions.NoScriptError) or (
        isinstance(result, redis.exceptions.ResponseError) and str(result).startswith(_NOSCRIPT)
    )


class redis_errors:
    """Context manager mapping redis-py errors onto this library's exceptions."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None or not isinstance(exc, redis.exceptions.RedisError):
            return False
        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            raise RedisUnavailable(f"Redis unavailable during {self.what}: {exc}") from exc
        if isinstance(exc, redis.exceptions.BusyLoadingError):
            raise RedisUnavailable(f"Redis is loading its data during {self.what}") from exc
        raise ScriptFailed(f"{self.what} failed: {exc}") from exc
