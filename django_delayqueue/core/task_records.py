"""Writes to a task's result record: the hash beside its message (``QueueKeys.task_result``).

A part of :class:`~django_delayqueue.core.queue.Queue`, given the queue's
:class:`~.queue_place.QueuePlace`. The record's statuses, field names and the order of its
writes are named here, because the consumer writes a stopped task's end itself
(core/consumer/limits/stopped.py) and the core imports nothing above it; what the fields mean is
told by the Tasks backend, which re-exports these names (django_delayqueue.tasks.payload). How a
write lands whatever order writes arrive in is ``write_record.lua``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from json.encoder import encode_basestring as _quoted
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.scripts.calls import LuaScript, ScriptCall, redis_errors
from django_delayqueue.core.scripts.contracts import WRITE_RECORD, WRITE_RECORDS

if TYPE_CHECKING:
    from django_delayqueue.core.queue_place import QueuePlace

# A task's status, as its record's ``status`` field holds it.
READY = "READY"
RUNNING = "RUNNING"
FAILED = "FAILED"
SUCCESSFUL = "SUCCESSFUL"  # the framework's own spelling is framework.SUCCESSFUL
FINISHED = frozenset({FAILED, SUCCESSFUL})

# The fields of a record hash (see django_delayqueue.tasks.payload's docstring).
ENQUEUED = "enqueued"
STATUS = "status"
STARTED_AT = "started_at"
LAST_ATTEMPTED_AT = "last_attempted_at"
FINISHED_AT = "finished_at"
RETURN_VALUE = "return_value"
WORKER_PREFIX = "worker:"
ERROR_PREFIX = "error:"
ORDER = "order"  # written by write_record.lua itself


def write_order(token: bytes | str | None, status: str) -> int:
    """The order of a delivery's write of ``status``: by delivery token (they only grow), and
    within one delivery its RUNNING before its end (READY, FAILED or SUCCESSFUL)."""
    return 2 * _token_number(token) + (status != RUNNING)


def _token_number(token: bytes | str | None) -> int:
    try:
        return int(token or 0)
    except ValueError:  # tokens are counters: never here
        return 0


class TaskRecords:
    """Builds the writes of one queue's task result records."""

    def __init__(self, place: QueuePlace) -> None:
        self.place = place

    def record_write_call(
        self,
        message_id: str,
        *,
        order: int,
        kept_seconds: int = 0,
        absent: Sequence[Any] = (),
        in_order: Sequence[Any] = (),
        deleted: Sequence[str] = (),
        always: Sequence[Any] = (),
        required: str | None = None,
        mergeable: bool = False,
        fields: str | None = None,
        key: str | None = None,
    ) -> ScriptCall:
        """The write of fields of the result record of ``message_id``, to run alone or with
        the consumer's round trip: the field, value pairs ``absent`` set where the field is
        not there yet, ``in_order`` set and the fields ``deleted`` removed only when ``order``
        is not below the record's (with the expiry: ``kept_seconds`` from now, 0 for none),
        and the pairs ``always`` set whatever the order. With ``required``, a record without
        that field is left as it is (the call's reply is then -1).

        ``mergeable``: a call of write_records.lua instead (its reply read by
        :func:`~django_delayqueue.core.consumer.rounds.merged_writes.record_replies`), which a
        consumer's round sends as one call with the other such writes of the queue (see
        django_delayqueue.core.consumer.rounds.merged_writes). ``fields``: the four lists' text as
        :func:`record_fields` makes it, and ``key`` the record's, built by the caller already."""
        # Built here rather than through Contract.call: a worker builds one per task it runs.
        if key is None:
            key = self.place.keys.task_result(message_id)
        if fields is None:
            fields = record_fields(absent, in_order, deleted, always)
        if mergeable:
            return merged_record_write(key, int(kept_seconds), int(order), required, fields)
        args = [kept_seconds, order, fields]
        if required is not None:
            args.append(required)
        return ScriptCall(WRITE_RECORD.script, [key], args)

    def load_record_script(self) -> None:
        """Load the scripts of record writes ahead of the first (a NOSCRIPT costs a trip)."""
        with redis_errors(f"loading scripts on {self.place.name}"):
            self.place.client.script_load(WRITE_RECORD.script.source)
            self.place.client.script_load(WRITE_RECORDS.script.source)


def merged_record_write(
    key: str, kept_seconds: int, order: int, required: str | None, fields: str
) -> ScriptCall:
    """``record_write_call(..., mergeable=True)`` with every part built already (``fields`` as
    :func:`record_fields` makes it, the numbers whole): a worker makes one per task it runs,
    and the keyword call and its checks showed on its profile."""
    write = f"{kept_seconds} {order} {required or ''} {fields}"
    return ScriptCall(_records_script(), [key], [write])


def success_fields(
    started_at: int, finished_at: int, worker_field: str, worker_id: str, returned: str
) -> str:
    """A success's fields as write_records.lua reads them in place of :func:`record_fields`'
    JSON (``success_write`` in includes/record_write.lua): its start (set where absent), its
    status SUCCESSFUL, last_attempted_at (its start), ``finished_at`` and ``returned`` (the
    return value's JSON) in order, and ``worker_field`` (``worker:<token>``) set to
    ``worker_id`` always. Plain text after a "!": the numbers, the worker's field, the return
    value's length, then the return value and the worker id as they are (no escaping: Redis
    takes them by length and to the end). The length is the return value's because its JSON
    is ASCII (tasks/return_values.py), so its characters are its bytes whatever encoding the
    user's Redis client sends text in; a worker id's bytes depend on it (its name may hold
    anything). Every task that returns sends one."""
    # (Not ASCII, from a caller of its own: its length in UTF-8, a Redis client's default.)
    length = len(returned) if returned.isascii() else len(returned.encode())
    return f"!{started_at} {finished_at} {worker_field} {length} {returned}{worker_id}"


def success_write(
    key: str,
    kept_seconds: int,
    order: int,
    started_at: int,
    finished_at: int,
    worker_field: str,
    worker_id: str,
    returned: str,
) -> ScriptCall:
    """``merged_record_write(key, kept_seconds, order, ENQUEUED, success_fields(started_at,
    finished_at, worker_field, worker_id, returned))``, its text made at once (the same text:
    tests/app/test_tasks_record.py compares them): every task that returns sends one, and the
    two calls and two texts showed on a worker's profile."""
    length = len(returned) if returned.isascii() else len(returned.encode())
    write = (
        f"{kept_seconds} {order} {ENQUEUED} "
        f"!{started_at} {finished_at} {worker_field} {length} {returned}{worker_id}"
    )
    return ScriptCall(_records_script(), [key], [write])


def _records_script() -> LuaScript:
    script = _kept_script[0]
    if script is None:
        script = _kept_script[0] = WRITE_RECORDS.script
    return script


_kept_script: list[LuaScript | None] = [None]  # write_records.lua, once rendered


def record_fields(
    absent: Sequence[Any], in_order: Sequence[Any], deleted: Sequence[str], always: Sequence[Any]
) -> str:
    """write_record.lua's ARGV[3]: the four lists as JSON, every value as the text Redis would
    store for it (a number as its digits, bytes as UTF-8)."""
    # Every value a string: joined around json's own string escaping (C), which costs a worker
    # less than an encoder's walk of the lists, and writes the same text as
    # json.JSONEncoder(separators=(",", ":"), ensure_ascii=False) would. Not ASCII-only: a
    # value reaches Redis as the same UTF-8 bytes it would as an argument of its own.
    return (
        "[["
        + "],[".join(
            ",".join([_quoted(v if type(v) is str else _text(v)) for v in part])
            for part in (absent, in_order, deleted, always)
        )
        + "]]"
    )


def _text(value: Any) -> str:
    if isinstance(value, str):  # a subclass of str
        return str(value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a record field's value must be text or a whole number: {value!r}")
    return str(value)
