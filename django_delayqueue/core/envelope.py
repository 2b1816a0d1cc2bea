"""The envelope stored per message, and the :class:`Message` a handler receives.

A pending message costs Redis one zset entry and one hash entry, and the envelope is most of
the second. So it is ``<due>,<due - scheduled>,<payload JSON>`` with both times in hex
milliseconds: 20 bytes around a payload for delays up to three days, where a JSON object spent
42. With a 100-byte payload that is what keeps the hash value in jemalloc's 128-byte size class
rather than the 160-byte one. The queue name lives in the key and the attempt in its own hash.
Payloads are JSON only: nothing read from Redis is ever unpickled or evaluated. Envelopes
written by earlier versions (a JSON object ``{"d":due,"s":scheduled,"p":payload}``) are still
read.

A message scheduled inside an OpenTelemetry span carries that span's context after the times
(and its flow key, if any) and before the payload: ``^<trace>\n`` (:data:`TRACE_MARK`; its text is
``django_delayqueue.observability.context``'s, opaque here). Absent without a span, so an
envelope costs nothing more then. No JSON text starts with "^", and the text never holds a
newline (the W3C headers it comes from cannot), so the field ends at the first one.

Its format (docs/upgrades.md): format 1 is every envelope written before formats had numbers,
and says nothing of it; an envelope of format 2 or later says ``v<n>,`` right after the times and
the flow key, which keep their place in every format (the Lua scripts of every release read
them). A producer writes the lowest format that holds what a message carries, so a message
needs no newer consumer than it must; a reader that meets a format newer than it reads raises
:class:`NewerEnvelope`, and a consumer leaves that message for a consumer that reads it.

A payload is accepted only when every consumer can decode it again: JSON that nests at most
:data:`MAX_PAYLOAD_DEPTH` levels and is valid UTF-8. Decoding never raises anything but
:class:`CorruptEnvelope`, whatever Redis holds (a too-deep payload written by an older producer
or another language included), so one bad message costs only itself.
"""

from __future__ import annotations

import json
import os
import re
from base64 import urlsafe_b64encode
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from hashlib import sha256
from typing import Any

from django_delayqueue.core import running
from django_delayqueue.core.errors import CorruptEnvelope, NewerEnvelope, PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024
MAX_ID_LENGTH = 200
# The deepest nesting of arrays and objects a payload may have. Python's json decodes each
# level with one step of the recursion limit (1000 by default), where the consumer's own stack
# takes some: a payload encoded by a shallow producer (a script, a Spark task) just under that
# limit raised RecursionError in the consumer. With at most 200 levels a payload decodes in any
# consumer whose own stack is up to ~750 frames deep (tests/core/test_core_envelope.py checks it).
MAX_PAYLOAD_DEPTH = 200
_CONTAINERS = (dict, list, tuple)  # what json encodes as an object or an array

# "<due>,<due - scheduled>," in hex; the same pattern as envelope_times() in
# lua/includes/envelope.lua.
_HEAD = re.compile(r"(-?[0-9a-fA-F]+),(-?[0-9a-fA-F]+),")
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_encode_ascii = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def new_id() -> str:
    """A random message id: 72 bits in 12 URL-safe characters.

    An id is stored twice per pending message; 12 characters keep each copy in jemalloc's
    16-byte size class. Ids only need to be unique among the messages alive at once: with ten
    million of them, the chance that a new id meets one is about 1 in 10^14.
    """
    return urlsafe_b64encode(os.urandom(9)).decode()  # 9 bytes: 12 characters, no padding


def validate_id(message_id: Any) -> str:
    if not isinstance(message_id, str) or not message_id:
        raise PayloadError(f"message id must be a non-empty string, not {message_id!r}")
    if len(message_id) > MAX_ID_LENGTH:
        raise PayloadError(f"message id is {len(message_id)} characters, over {MAX_ID_LENGTH}")
    if not message_id.isprintable() or message_id != message_id.strip():
        raise PayloadError(f"message id {message_id!r} has control characters or edge spaces")
    return message_id


def encode_payload(payload: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """JSON-encode a payload, refusing what is not JSON, what a consumer could not decode again
    (see :func:`encode_json`) or what is larger than ``max_bytes``."""
    text, size = _checked_json(payload, "payload", _encode)
    if size > max_bytes:
        raise PayloadError(
            f"payload is {size} bytes of JSON, over the {max_bytes}-byte limit (max_payload_bytes)"
        )
    return text


def encode_json(value: Any, what: str = "payload", *, ascii_only: bool = False) -> str:
    """``value`` as compact JSON that decodes back to it anywhere, else PayloadError naming why.

    Refused: what json cannot encode (PayloadError from the TypeError or ValueError it raised),
    nesting deeper than :data:`MAX_PAYLOAD_DEPTH`, and text with a lone surrogate (what
    ``os.fsdecode`` makes of an undecodable file name), which is not UTF-8 and cannot be sent
    to Redis. With ``ascii_only`` non-ASCII text is escaped, so lone surrogates are kept.
    """
    return _checked_json(value, what, _encode_ascii if ascii_only else _encode)[0]


def _checked_json(value: Any, what: str, encode: Callable[[Any], str]) -> tuple[str, int]:
    """The JSON text of ``value`` and its size in UTF-8 bytes; PayloadError if refused."""
    try:
        text = encode(value)
    except RecursionError:  # nested near the recursion limit: far beyond MAX_PAYLOAD_DEPTH
        raise PayloadError(_too_deep(what)) from None
    except (TypeError, ValueError) as e:
        raise PayloadError(f"{what} is not JSON-serialisable: {e}") from e
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise PayloadError(
                f"{what} holds a lone surrogate {e.object[e.start]!r} (character {e.start} of "
                "its JSON), which is not valid UTF-8: decode bytes with a real encoding, or "
                "escape them (e.g. 'backslashreplace') before scheduling"
            ) from None
    # Only JSON with more opening brackets than the limit can nest deeper than it: a count at
    # C speed spares almost every payload the walk below.
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH and _nests_deeper(value):
        raise PayloadError(_too_deep(what))
    return text, size


def _nests_deeper(value: Any, limit: int = MAX_PAYLOAD_DEPTH) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` levels deep.

    Level by level, without recursion (the caller's stack may be deep already); each container
    is looked at once.
    """
    level = [value] if isinstance(value, _CONTAINERS) else []
    for _ in range(limit):
        if not level:
            return False
        level = [
            child
            for container in level
            for child in (container.values() if isinstance(container, dict) else container)
            if isinstance(child, _CONTAINERS)
        ]
    return bool(level)


def _too_deep(what: str) -> str:
    return (
        f"{what} nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep, "
        "which not every consumer could decode"
    )


# Between the times and the payload of a task's envelope (``<due>,<lead>,t,<payload>``): put
# there only by the Tasks backend and by a recurring ``task`` schedule, never from a payload, so
# what a caller of ``dq.schedule`` sends (a webhook's JSON, say) is never run as a task. No JSON
# text starts with "t," (``true`` goes on with "r"), and the Lua scripts read only the times.
TASK_MARK = "t,"
# After the flow key (below) if any, before the task mark: the trace context of the span the
# message was scheduled in (see the module's docstring), ended by a newline. In full:
# ``<due>,<lead>,[k<n>,<key>][^<trace>\n][t,]<payload>``.
TRACE_MARK = "^"

# A message's flow key (``dq.schedule(..., key=...)``, docs/flow-control.md "Keys") travels in
# its envelope between the times and the rest: ``<due>,<lead>,k<n>,<key>[t,]<payload>``, ``n``
# the key's length in UTF-8 bytes, in hex. Length-prefixed, so a key may hold any character
# (a comma, a "t,"); no JSON text starts with "k", so an envelope without a key reads as before.
# Absent when the message has no key. lua/includes/flow_keys.lua reads it (envelope_key) to
# keep the queue's flow_keys hash, so every way of storing an envelope (the outbox's rows, a
# successor, a requeue) keeps its key without an argument of its own.
KEY_MARK = "k"
MAX_KEY_LENGTH = 200

# The envelope's format (docs/upgrades.md says what a format promises). The newest this
# release reads, and the most it writes: a message is written in the lowest format that holds
# it (format 1, with no number, for everything this release writes by itself).
# Format 1: ``<due>,<lead>,[k<n>,<key>][^<trace>\n][t,]<payload>`` (or the JSON object of the
#   first releases): what every release before formats had numbers writes and reads.
# Format 2: format 1 with ``v2,`` after the key: the first format a reader must be told about.
#   It carries nothing format 1 lacks, so nothing needs it by itself; written only when asked
#   (``format=2``): what a drill of a consumer pinned to format 1 beside a new producer uses.
# A later format that adds a field raises ENVELOPE_FORMAT, writes its number (FORMAT_MARK)
# only on the envelopes that carry the field, and may change what follows the number, never
# what comes before it.
ENVELOPE_FORMAT = 2
FORMAT_MARK = "v"
FIRST_NUMBERED_FORMAT = 2  # format 1 has no number: a "v1," is corrupt
_FORMAT_HEAD = re.compile(r"v([0-9]{1,4}),")


def validate_format(value: Any, what: str = "envelope format") -> int:
    """Return ``value`` if it is a format this release knows (1 to :data:`ENVELOPE_FORMAT`),
    else raise PayloadError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(f"{what} must be an int, not {type(value).__name__} {value!r}")
    if not 1 <= value <= ENVELOPE_FORMAT:
        raise PayloadError(
            f"{what} must be between 1 and {ENVELOPE_FORMAT} (the newest this release knows), "
            f"not {value}"
        )
    return value


def validate_key(key: Any) -> str:
    """Return ``key`` if it can be a message's flow key, else raise PayloadError saying why:
    a non-empty str of at most :data:`MAX_KEY_LENGTH` characters, valid UTF-8."""
    if not isinstance(key, str):
        raise PayloadError(f"key must be a string, not {type(key).__name__} {key!r}")
    if not key:
        raise PayloadError("key must be a non-empty string (None for no key)")
    if len(key) > MAX_KEY_LENGTH:
        raise PayloadError(f"key is {len(key)} characters, over {MAX_KEY_LENGTH}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError(f"key {key!r} holds a lone surrogate, which is not UTF-8") from None
    return key


def encode_envelope(
    payload_json: str,
    due_ms: int,
    scheduled_ms: int,
    *,
    task: bool = False,
    key: str | None = None,
    trace: str = "",
    format: int | None = None,
) -> str:
    """The stored envelope; ``key`` (validated by :func:`validate_key`) or None for none;
    ``trace`` (from ``observability.context.current_trace``, "" for none) is stored as it is
    and must hold no newline. ``format``: None writes the lowest format that holds the
    message (what every producer does); a number (see :func:`validate_format`) writes that
    format, for a drill of consumers of different formats."""
    due = int(due_ms)
    mark = TASK_MARK if task else ""
    if trace:
        mark = f"{TRACE_MARK}{trace}\n{mark}"
    if format is not None and validate_format(format) >= FIRST_NUMBERED_FORMAT:
        mark = f"{FORMAT_MARK}{format},{mark}"
    if key is not None:  # first: lua/includes/flow_keys.lua reads it right after the times
        mark = f"{KEY_MARK}{len(key.encode('utf-8')):x},{key}{mark}"
    return f"{due:x},{due - int(scheduled_ms):x},{mark}{payload_json}"


def has_key(envelope: str) -> bool:
    """Whether an encoded envelope carries a flow key (a cheap look, not a full decode)."""
    head = _HEAD.match(envelope)
    return head is not None and envelope.startswith(KEY_MARK, head.end())


@dataclass(frozen=True)
class EnvelopeParts:
    """Everything an envelope holds."""

    due_ms: int
    scheduled_ms: int
    payload: Any
    task: bool = False
    key: str | None = None
    trace: str = ""  # the TRACE_MARK field, "" for none
    format: int = 1  # the envelope's format (its FORMAT_MARK; 1 without one)


def decode_envelope(raw: bytes | str | None) -> tuple[int, int, Any]:
    """Return ``(due_ms, scheduled_ms, payload)``; raise :class:`CorruptEnvelope` otherwise.

    Nothing else, whatever ``raw`` is: a payload nested deeper than the recursion limit allows
    here (RecursionError), or a number past Python's int-string limit (ValueError), is a
    corrupt envelope too, so a consumer buries that one message and delivers the others. An
    envelope of a newer format than this release reads raises :class:`NewerEnvelope` (a
    CorruptEnvelope here).
    """
    due, scheduled, payload, _task = decode_marked_envelope(raw)
    return due, scheduled, payload


def decode_marked_envelope(raw: bytes | str | None) -> tuple[int, int, Any, bool]:
    """:func:`decode_envelope`, and whether the envelope carries the task mark."""
    parts = decode_envelope_parts(raw)
    return parts.due_ms, parts.scheduled_ms, parts.payload, parts.task


def decode_envelope_parts(raw: bytes | str | None, reads: int = ENVELOPE_FORMAT) -> EnvelopeParts:
    """Everything in the envelope (its key too); raise :class:`CorruptEnvelope` otherwise, or
    :class:`NewerEnvelope` when its format is newer than ``reads`` (the newest format the
    reader reads: a consumer pinned to an older one passes it)."""
    try:
        return _decode_envelope(raw, reads)
    except CorruptEnvelope:
        raise
    except RecursionError:
        raise CorruptEnvelope(
            "corrupt: envelope payload nests too deeply to decode (RecursionError); "
            f"payloads are refused at schedule time beyond {MAX_PAYLOAD_DEPTH} levels"
        ) from None
    except Exception as e:
        raise CorruptEnvelope(f"corrupt: envelope cannot be decoded ({e!r})") from e


def _decode_envelope(raw: bytes | str | None, reads: int) -> EnvelopeParts:
    if raw is None or raw == b"" or raw == "":
        raise CorruptEnvelope("corrupt: envelope missing")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if text.startswith("{"):
        return EnvelopeParts(*_decode_json_envelope(raw))
    head = _HEAD.match(text)
    if head is None:
        raise CorruptEnvelope("corrupt: envelope does not start with hex due and lead times")
    due, lead = int(head[1], 16), int(head[2], 16)
    key, start = _read_key(text, head.end())
    format, start = _read_format(text, start)
    if format > reads:  # what follows the number is that format's: not read here
        raise NewerEnvelope(format, reads)
    trace = ""
    if text.startswith(TRACE_MARK, start):
        end = text.find("\n", start)
        if end < 0:
            raise CorruptEnvelope("corrupt: envelope trace context has no end")
        trace, start = text[start + len(TRACE_MARK) : end], end + 1
    task = text.startswith(TASK_MARK, start)
    try:
        payload = json.loads(text[start + len(TASK_MARK) if task else start :])
    except ValueError as e:
        raise CorruptEnvelope(f"corrupt: envelope payload is not JSON ({e})") from e
    return EnvelopeParts(due, due - lead, payload, task, key, trace, format)


def _read_format(text: str, start: int) -> tuple[int, int]:
    """The format an envelope's text says at ``start`` (1 when it says none) and where the
    rest begins."""
    head = _FORMAT_HEAD.match(text, start)
    if head is None:
        return 1, start
    format = int(head[1])
    if format < FIRST_NUMBERED_FORMAT:
        raise CorruptEnvelope(f"corrupt: envelope says format {format}, which has no number")
    return format, head.end()


_KEY_HEAD = re.compile(r"k([0-9a-f]{1,4}),")


def _read_key(text: str, start: int) -> tuple[str | None, int]:
    """The flow key at ``start`` of an envelope's text (None if it has none) and where the
    rest begins. The key's length is in UTF-8 bytes (what Lua counts): n bytes are at most n
    characters, so the key is in the n characters after the comma."""
    head = _KEY_HEAD.match(text, start)
    if head is None:
        return None, start
    size = int(head[1], 16)
    at = head.end()
    window = text[at : at + size]
    # n bytes are at most n characters: the key is the first n bytes of the next n characters.
    key = window if window.isascii() else window.encode("utf-8")[:size].decode("utf-8")
    if len(key.encode("utf-8")) != size:
        raise CorruptEnvelope("corrupt: envelope's key is shorter than its length says")
    return key, at + len(key)


def _decode_json_envelope(raw: bytes | str) -> tuple[int, int, Any]:
    """An envelope in the JSON object form of earlier versions."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptEnvelope(f"corrupt: envelope is not JSON ({e})") from e
    if not isinstance(data, dict) or "p" not in data:
        raise CorruptEnvelope("corrupt: envelope is not an object with a payload")
    due, scheduled = data.get("d"), data.get("s")
    if not isinstance(due, int) or not isinstance(scheduled, int):
        raise CorruptEnvelope("corrupt: envelope due/scheduled times are not integers")
    return due, scheduled, data["p"]


def idempotency_key(queue: str, message_id: str, scheduled_ms: int) -> str:
    """:attr:`Message.idempotency_key` of the message ``message_id`` of ``queue`` (its logical
    queue, for a shard's) scheduled at ``scheduled_ms``."""
    digest = sha256(f"{queue}\0{message_id}\0{int(scheduled_ms)}".encode("utf-8", "surrogatepass"))
    return "dq-" + digest.hexdigest()[:32]


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class Message:
    """One delivery of a message, as a handler sees it."""

    id: str
    queue: str
    payload: Any
    due_ms: int
    scheduled_ms: int
    attempt: int
    token: str = ""
    claimed_ms: int = 0
    # Sent as a task by the Tasks backend (or a recurring ``task`` schedule): its envelope's
    # TASK_MARK, which no payload can set.
    task: bool = False
    # The flow key it was scheduled with (``key=``), None without one.
    key: str | None = None
    # The trace context of the span it was scheduled in (its envelope's TRACE_MARK field; ""
    # for none), read by django_delayqueue.observability only when tracing is on.
    trace: str = ""
    # When it came back to ready (a retry's retry time, a requeue, a "run now", a release),
    # as claim.lua read it: its handler does not start before it (consumer/rounds/waiter.py) and its
    # start lateness counts from then (core/timings). None: it did not come back, or the
    # consumer was not told.
    ready_since_ms: int | None = field(default=None, compare=False)
    # How long (ms) a flow limit held it back before its claim, as claim.lua counted it: taken
    # off its start lateness (core/timings). 0: no limit held it.
    limit_wait_ms: int = field(default=0, compare=False)

    @property
    def due_at(self) -> datetime:
        return ms_to_datetime(self.due_ms)

    @property
    def scheduled_at(self) -> datetime:
        return ms_to_datetime(self.scheduled_ms)

    @property
    def idempotency_key(self) -> str:
        """A key for this message's side effects outside the database (a payment or SMS
        gateway that accepts one): the same at every attempt and redelivery of this message,
        different for a later message scheduled with the same id. 35 ASCII characters.

        Made of the queue, the id and the scheduled time (ms), which the envelope carries
        unchanged through retries, redeliveries, requeues and the outbox's relay; a later
        message reusing the id was scheduled at a later millisecond (see
        docs/exactly-once.md)."""
        return idempotency_key(self.queue, self.id, self.scheduled_ms)

    @property
    def aborted(self) -> bool:
        """Whether this delivery was aborted (``dq.abort``, the admin's "Stop") while it runs:
        true within about a second of the abort. Stop cleanly when it is: the message goes to
        the dead letters whatever the handler does (see docs/workers.md)."""
        return running.abort_requested(self)

    def progress(self, percent: float, note: str = "") -> bool:
        """Report how far the handler of this delivery got: ``percent`` from 0 to 100 and a
        short ``note`` (cut to 200 characters). Shown in the admin's in-flight list and
        ``queuestats`` within about 0.2 s; costs no Redis call here (the consumer sends the
        latest report with its next beat). ValueError for a percent out of range. False (and
        nothing sent) once this delivery no longer runs in this process (see docs/progress.md).
        """
        return running.progress(self, percent, note)


def storable_text(text: Any, limit: int) -> str:
    """``text`` as a script argument Redis can take: a str of at most ``limit`` characters,
    valid UTF-8. A handler's reason may hold a lone surrogate (a FileNotFoundError names an
    undecodable file name so): redis-py could not encode it, and the batch carrying it, every
    ack of the round with it, would fail again every round. Escaped, it is kept visible."""
    value = (text if isinstance(text, str) else str(text))[:limit]
    return value if value.isascii() else value.encode("utf-8", "backslashreplace").decode()


def to_str(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
