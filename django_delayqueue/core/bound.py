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

from .errors import ScriptFailed
from .scripts import LuaScript, ScriptBatch, is_noscript, redis_errors

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
        command = self._encode(args)
        with redis_errors(self.script.name):
            replies = self._send([command])
        if replies is not None and not isinstance(replies[0], redis.exceptions.ResponseError):
            return replies[0]  # the usual case; call_many handles NOSCRIPT and errors
        return self.call_many([args])[0]

    def call_many(self, arg_lists: Sequence[Sequence[Any]]) -> list[Any]:
        """One call per argument list, all sent in one round trip; a script error raises.

        After a ``SCRIPT FLUSH`` only the calls that got NOSCRIPT (which did nothing) are sent
        again, so no call runs twice.
        """
        if not arg_lists:
            return []
        if not self._direct:
            return self._through_redis_py(arg_lists)
        commands = [self._encode(args) for args in arg_lists]
        with redis_errors(self.script.name):
            replies = self._send(commands)
            if replies is None:
                return self._through_redis_py(arg_lists)
            missing = [i for i, reply in enumerate(replies) if is_noscript(reply)]
            if missing:
                self.client.script_load(self.script.source)
                again = self._send([commands[i] for i in missing])
                if again is None:
                    return self._through_redis_py([arg_lists[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        for reply in replies:
            if isinstance(reply, redis.exceptions.ResponseError):
                raise ScriptFailed(f"{self.script.name}.lua failed: {reply}") from reply
        return replies

    def _encode(self, args: Sequence[Any]) -> bytes:
        count = self._head_count + len(args)
        return b"*%d\r\n%b%b" % (count, self._head, encode_arguments(args))

    def _send(self, commands: list[bytes]) -> list[Any] | None:
        """The replies (errors in place), or None when the connection broke."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command(commands)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.exceptions.ResponseError as e:  # this call failed, not the others
                    replies.append(e)
            return replies
        except _BROKEN_CONNECTION:
            connection.disconnect()
            return None
        finally:
            pool.release(connection)

    def _through_redis_py(self, arg_lists: Sequence[Sequence[Any]]) -> list[Any]:
        """The same calls through redis-py (a retry policy, any kind of client)."""
        batch = ScriptBatch()
        for args in arg_lists:
            batch.add(self.script, self.keys, [*self.fixed, *args])
        return batch.run(self.client)
