"""One script call with its keys and leading arguments encoded once, for per-message paths.

``Queue.schedule`` sends one EVALSHA per message, so building that command costs a real share
of its time: redis-py encodes every argument on every call, and its ``execute_command`` adds
bookkeeping (retries, observability hooks) around each one. A :class:`BoundScript` encodes the
constant part (script, keys, leading arguments) once in the Redis protocol, appends the few
arguments that change and sends the result on a pooled connection. On a broken connection it
sends the call again through redis-py, which applies the client's own retry policy. Clients
other than a plain ``redis.Redis`` (a cluster client, a single-connection client, a subclass
that may wrap commands) always go through redis-py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from .scripts import LuaScript, redis_errors

_BROKEN_CONNECTION = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


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
        self, script: LuaScript, client: Any, keys: Sequence[str], fixed: Sequence[Any]
    ) -> None:
        self.script = script
        self.client = client
        self.keys = list(keys)
        self.fixed = list(fixed)
        self._direct = type(client) is redis.Redis and client.connection is None
        head = ["EVALSHA", script.sha, len(self.keys), *self.keys, *self.fixed]
        self._head_count = len(head)
        self._head = encode_arguments(head)

    def __call__(self, *args: Any) -> Any:
        """Run the script with the bound arguments followed by ``args``."""
        if not self._direct:
            return self.script(self.client, self.keys, [*self.fixed, *args])
        command = b"*%d\r\n%b%b" % (
            self._head_count + len(args),
            self._head,
            encode_arguments(args),
        )
        with redis_errors(self.script.name):
            try:
                reply = self._send(command)
            except redis.exceptions.NoScriptError:
                self.client.script_load(self.script.source)
                reply = self._send(command)
        if reply is _BROKEN:
            return self.script(self.client, self.keys, [*self.fixed, *args])
        return reply

    def _send(self, command: bytes) -> Any:
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command([command])
            return connection.read_response()
        except _BROKEN_CONNECTION:
            connection.disconnect()
            return _BROKEN
        finally:
            pool.release(connection)


_BROKEN = object()  # _send's reply when the connection broke: send again through redis-py
