"""One script call with its keys and leading arguments encoded once, for per-message paths.

``Queue.schedule`` sends one EVALSHA per message, so building that command costs a real share
of its time: redis-py encodes every argument on every call, and its ``execute_command`` adds
bookkeeping (retries, observability hooks) around each one. A :class:`BoundScript` encodes the
constant part (script, keys, leading arguments) once in the Redis protocol, appends the few
arguments that change and sends the result on a pooled connection. On a broken connection it
sends the calls whose reply it had not read again through redis-py, which applies the client's
own retry policy. Clients
other than a plain ``redis.Redis`` (a cluster client, a single-connection client, a subclass
that may wrap commands) always go through redis-py.

Taking a connection from redis-py's pool and giving it back costs a third of a ``schedule()``
(a lock, a ``select()`` to check that the socket is clean, bookkeeping), so each pool keeps one
connection checked out for the bound calls of whichever thread finds it free; a thread that
finds it busy takes one from the pool as before. Only a plain ``ConnectionPool`` with room for
many connections keeps one (a small or blocking pool is left whole); a forked child takes its
own. A call interrupted half-way drops the connection's socket, so no unread reply is ever
left on it.
"""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.scripts.calls import (
    LuaScript,
    ScriptBatch,
    ScriptCall,
    is_noscript,
    redis_errors,
    script_error,
)

_BROKEN_CONNECTION = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# Keep a connection checked out only from a pool this large (redis-py's default is 100): one
# connection less must not make another command wait for, or fail to get, a free one.
KEEP_FROM_POOLS_OF_AT_LEAST = 50


class _KeptConnection:
    """The one connection of a pool kept checked out for bound calls (use with ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._connection: Any = None
        self._pid = 0

    def get(self, pool: Any) -> Any:
        if self._connection is None or self._pid != os.getpid():
            # After a fork the parent's connection (and socket) is not ours to use.
            self._connection, self._pid = get_connection(pool), os.getpid()
        return self._connection


def get_connection(pool: Any) -> Any:
    """A connection from ``pool``, on every redis-py that setup.cfg allows.

    redis-py 5.0 to 5.2 require a command name (only used by the cluster client); 5.3 made it
    optional and warns when one is given. Which one a pool wants is read from its signature
    once per pool class, not tried and caught: a TypeError from inside the pool is a real error.
    """
    if _needs_command_name(type(pool)):
        return pool.get_connection("EVALSHA")
    return pool.get_connection()


_needs_name_by_class: dict[type, bool] = {}


def _needs_command_name(pool_class: type[redis.ConnectionPool]) -> bool:
    needs = _needs_name_by_class.get(pool_class)
    if needs is None:
        # inspect.signature follows the __wrapped__ of redis-py's @deprecated_args wrapper.
        parameter = inspect.signature(pool_class.get_connection).parameters.get("command_name")
        needs = parameter is not None and parameter.default is inspect.Parameter.empty
        _needs_name_by_class[pool_class] = needs
    return needs


_kept_by_pool: weakref.WeakKeyDictionary[Any, _KeptConnection] = weakref.WeakKeyDictionary()
_kept_by_pool_lock = threading.Lock()


def _kept_connection(pool: Any) -> _KeptConnection | None:
    """The kept connection of ``pool``, or None for a pool that must be left whole."""
    if type(pool) is not redis.ConnectionPool:
        return None
    if pool.max_connections < KEEP_FROM_POOLS_OF_AT_LEAST:
        return None
    with _kept_by_pool_lock:
        return _kept_by_pool.setdefault(pool, _KeptConnection())


def encode_arguments(args: Sequence[Any]) -> bytes:
    """``args`` as Redis protocol bulk strings (str as UTF-8, numbers in decimal)."""
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


class BoundScript:
    """``script`` on ``client`` with ``keys`` and the leading ``fixed`` arguments bound."""

    def __init__(
        self,
        script: LuaScript,
        client: RedisClient,
        keys: Sequence[str],
        fixed: Sequence[Any] = (),
    ) -> None:
        self.script = script
        self.client = client
        self.keys = list(keys)
        self.fixed = list(fixed)
        # Only a plain client's pool is used directly; a cluster client (or one pinned to a
        # single connection) goes through redis-py.
        self._pool = client.connection_pool if isinstance(client, redis.Redis) else None
        self._direct = (
            self._pool is not None and type(client) is redis.Redis and client.connection is None
        )
        self._kept = _kept_connection(self._pool) if self._direct and self._pool else None
        head = ["EVALSHA", script.sha, len(self.keys), *self.keys, *self.fixed]
        self._head_count = len(head)
        self._head = encode_arguments(head)

    def __call__(self, *args: Any) -> Any:
        """Run the script with the bound arguments followed by ``args``."""
        if not self._direct:
            return ScriptCall(self.script, self.keys, [*self.fixed, *args]).run(self.client)
        command = self._encode(args)
        with redis_errors(self.script.name):
            replies = self._send([command])
        if not replies:  # a broken connection: redis-py's retry policy decides
            return self._through_redis_py([args])[0]
        if is_noscript(replies[0]):  # after a SCRIPT FLUSH: load it and send again
            return self.call_many([args])[0]
        return _raise_script_errors(self.script, replies)[0]

    def call_many(
        self, arg_lists: Sequence[Sequence[Any]], *, raise_errors: bool = True
    ) -> list[Any]:
        """One call per argument list, all sent in one round trip; a script error raises
        (or, without ``raise_errors``, is returned in its place: a redis-py ResponseError).

        After a ``SCRIPT FLUSH`` only the calls that got NOSCRIPT (which did nothing) are sent
        again, so no call runs twice. A connection that breaks mid-batch keeps the replies
        already read: only the calls without one are sent again (through redis-py and its retry
        policy). Those may have run without their reply reaching us, which the scripts' own
        idempotence covers (a schedule of an id already there is counted as a duplicate).
        """
        if not arg_lists:
            return []
        if not self._direct:
            return self._through_redis_py(arg_lists, raise_errors)
        commands = [self._encode(args) for args in arg_lists]
        with redis_errors(self.script.name):
            replies = self._send(commands)
            if len(replies) < len(commands):
                replies += self._through_redis_py(arg_lists[len(replies) :], raise_errors)
            missing = [i for i, reply in enumerate(replies) if is_noscript(reply)]
            if missing:
                self.client.script_load(self.script.source)
                again = self._send([commands[i] for i in missing])
                unanswered = missing[len(again) :]
                if unanswered:
                    unsent = [arg_lists[i] for i in unanswered]
                    again += self._through_redis_py(unsent, raise_errors)
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        return _raise_script_errors(self.script, replies) if raise_errors else replies

    def _encode(self, args: Sequence[Any]) -> bytes:
        count = self._head_count + len(args)
        return b"*%d\r\n%b%b" % (count, self._head, encode_arguments(args))

    def _send(self, commands: list[bytes]) -> list[Any]:
        """The replies read, in order (errors in place): fewer than ``commands`` when the
        connection broke (then the first ones are still the replies of the first commands)."""
        pool = self._pool
        assert pool is not None  # only direct clients get here
        kept = self._kept
        if kept is not None and kept.lock.acquire(blocking=False):
            try:
                return _exchange(kept.get(pool), commands)
            finally:
                kept.lock.release()
        connection = get_connection(pool)
        try:
            return _exchange(connection, commands)
        finally:
            pool.release(connection)

    def _through_redis_py(
        self, arg_lists: Sequence[Sequence[Any]], raise_errors: bool = True
    ) -> list[Any]:
        """The same calls through redis-py (a retry policy, any kind of client)."""
        if len(arg_lists) == 1 and raise_errors:  # an outage is reported "during <script>"
            return [
                ScriptCall(self.script, self.keys, [*self.fixed, *arg_lists[0]]).run(self.client)
            ]
        batch = ScriptBatch()
        for args in arg_lists:
            batch.add(ScriptCall(self.script, self.keys, [*self.fixed, *args]))
        return batch.run(self.client, raise_errors)


def _exchange(connection: Any, commands: list[bytes]) -> list[Any]:
    """Send ``commands`` and read one reply each (errors in place).

    When the connection breaks, the replies read so far are returned (and the connection
    dropped): those calls ran exactly once, and must not be sent again.
    """
    replies: list[Any] = []
    try:
        connection.send_packed_command(commands)
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.exceptions.ResponseError as e:  # this call failed, not the others
                replies.append(e)
        return replies
    except _BROKEN_CONNECTION:
        connection.disconnect()
        return replies
    except BaseException:
        connection.disconnect()  # interrupted between a command and its reply: drop both
        raise


def _raise_script_errors(script: LuaScript, replies: list[Any]) -> list[Any]:
    """``replies``, or the error of the first error among them (ScriptFailed, or
    RedisOutOfMemory for a call refused for memory); no call is sent again."""
    for reply in replies:
        if isinstance(reply, redis.exceptions.ResponseError):
            raise script_error(script.name, reply) from reply
    return replies
