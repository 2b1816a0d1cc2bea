"""Running the scripts: a :class:`ScriptCall` (script, keys, arguments) is the one unit.

Every operation of a ``Queue`` describes itself as a ScriptCall (``Queue.claim_call`` and the
like), built from its script's contract (``contracts.py``); a call runs alone
(:meth:`ScriptCall.run`), with others in one pipeline (:class:`ScriptBatch`), or, for
``schedule()``, pre-encoded on a kept connection (``fast_path.BoundScript``). All three send
EVALSHA and recover from NOSCRIPT the same way.

Why not ``redis.Script`` in pipelines: redis-py sends ``SCRIPT EXISTS`` before every pipeline
that holds a script, which doubles the round trips of the consumer's hot path. Here a pipeline
sends EVALSHA only; the rare NOSCRIPT (after ``SCRIPT FLUSH`` or a restart) loads the script and
re-runs just the calls that failed, which is safe because a call that got NOSCRIPT did nothing.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, NamedTuple

import redis

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.errors import (
    DelayQueueError,
    RedisOutOfMemory,
    RedisUnavailable,
    ScriptFailed,
)
from django_delayqueue.core.scripts.loader import render

_NOSCRIPT = "NOSCRIPT"
# How Redis words a write refused for memory: a reply of its own (-OOM ...), or, from inside a
# script on Redis 6.2, wrapped in the script's error (ERR Error running script ... -OOM ...).
_OUT_OF_MEMORY = "command not allowed when used memory > 'maxmemory'"


@dataclass(frozen=True)
class LuaScript:
    name: str
    source: str
    sha: str

    @classmethod
    @cache
    def named(cls, name: str) -> LuaScript:
        source = render(name)
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


class ScriptCall(NamedTuple):
    """One call of ``script`` with ``keys`` and ``args`` (every key arrives through KEYS)."""

    script: LuaScript
    keys: Sequence[str]
    args: Sequence[Any]

    def run(self, client: RedisClient) -> Any:
        """Run the call now, loading the script if Redis does not know it."""
        script, keys, args = self
        with redis_errors(script.name):
            try:
                return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                client.script_load(script.source)
                return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


@dataclass
class ScriptBatch:
    """Several calls sent in one pipeline (one round trip)."""

    calls: list[ScriptCall] = field(default_factory=list)

    def add(self, call: ScriptCall) -> int:
        """Queue ``call``; returns its index in the results of :meth:`run`."""
        self.calls.append(call)
        return len(self.calls) - 1

    def run(self, client: RedisClient, raise_errors: bool = True) -> list[Any]:
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
                raise script_error(script.name, result) from result
        return results


# Scripts already loaded through each client. Loading before the first pipelined use keeps
# the calls of a pipeline in order: a NOSCRIPT re-run would run after the calls that followed
# it. After a SCRIPT FLUSH or a restart the re-run below is the (rare, still safe) fallback.
_loaded: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _load_once(client: RedisClient, scripts: set[LuaScript]) -> None:
    try:
        known = _loaded.setdefault(client, set())
    except TypeError:  # a client that cannot be weakly referenced: rely on the fallback
        return
    for script in scripts:
        if script.sha not in known:
            client.script_load(script.source)
            known.add(script.sha)


def _send(client: RedisClient, calls: list[ScriptCall]) -> list[Any]:
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


def is_out_of_memory(error: object) -> bool:
    """Whether ``error`` (ours, a redis-py error, or a script's error reply) is Redis refusing
    a write because ``used_memory`` is above ``maxmemory`` (with the ``noeviction`` policy)."""
    if isinstance(error, (RedisOutOfMemory, redis.exceptions.OutOfMemoryError)):
        return True
    return isinstance(error, redis.exceptions.ResponseError) and _OUT_OF_MEMORY in str(error)


# Refusals that pass by themselves (a replica before its promotion, a cluster moving or
# electing, a script cache just flushed): a write refused so is sent again, never dropped.
_PASSING_REFUSALS: tuple[type[Exception], ...] = (
    redis.exceptions.ReadOnlyError,  # READONLY
    redis.exceptions.NoScriptError,  # NOSCRIPT
    redis.exceptions.MasterDownError,  # MASTERDOWN: a demoted node in a Sentinel failover
    redis.exceptions.TryAgainError,  # TRYAGAIN
    redis.exceptions.AskError,  # ASK and MOVED (its subclass)
    redis.exceptions.ClusterDownError,  # CLUSTERDOWN
)
# Those redis-py parses into a plain ResponseError, its code kept at the start of the text
# (some of the above too, by an older redis-py or a parser that does not know them).
_PASSING_PREFIXES = (
    *("BUSY", "NOREPLICAS", "MISCONF", "LOADING", "READONLY", "NOSCRIPT", "MASTERDOWN"),
    *("TRYAGAIN", "ASK ", "MOVED", "CLUSTERDOWN"),
)


def passes_by_itself(error: BaseException) -> bool:
    """Whether Redis refused a call for a reason that passes by itself (a failover, a cluster
    moving slots, a busy script, a flushed script cache), not for good (a script error such as
    a key of the wrong type): ``error`` as redis-py raised it, or this library's ScriptFailed
    that wraps it (its cause, or the reply quoted after "failed: ")."""
    if isinstance(error, ScriptFailed):
        if error.__cause__ is not None:
            return passes_by_itself(error.__cause__)
        _, _, reply = str(error).partition(" failed: ")
        return reply.startswith(_PASSING_PREFIXES)
    return isinstance(error, _PASSING_REFUSALS) or str(error).startswith(_PASSING_PREFIXES)


def out_of_memory(what: str, error: object) -> RedisOutOfMemory:
    """The error to raise for ``what`` (a script call, say) refused for memory.

    Redis refuses a script's writes for memory only until its first write (6.2 and 7.x alike,
    for scripts without a shebang), so a refused script changed nothing: see
    ``lua/includes/memory.lua``.
    """
    return RedisOutOfMemory(
        f"Redis is out of memory (used_memory above maxmemory): {what} was refused and changed "
        f"nothing. Deliveries and acks go on and free memory; raise maxmemory or free memory "
        f"to write again (docs/redis.md). Redis said: {error}"
    )


def script_error(name: str, error: Exception) -> DelayQueueError:
    """What a script's error reply raises: RedisOutOfMemory when refused for memory, else
    ScriptFailed."""
    if is_out_of_memory(error):
        return out_of_memory(f"{name}.lua", error)
    return ScriptFailed(f"{name}.lua failed: {error}")


class redis_errors:
    """Context manager mapping redis-py errors onto this library's exceptions."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or not isinstance(exc, redis.exceptions.RedisError):
            return False
        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            raise RedisUnavailable(f"Redis unavailable during {self.what}: {exc}") from exc
        if isinstance(exc, redis.exceptions.BusyLoadingError):
            raise RedisUnavailable(f"Redis is loading its data during {self.what}") from exc
        if is_out_of_memory(exc):
            raise out_of_memory(self.what, exc) from exc
        raise ScriptFailed(f"{self.what} failed: {exc}") from exc
