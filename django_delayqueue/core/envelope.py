"""The envelope stored per message, and the :class:`Message` a handler receives.

A pending message costs Redis one zset entry and one hash entry, and the envelope is most of
the second. So it is ``<due>,<due - scheduled>,<payload JSON>`` with both times in hex
milliseconds: 20 bytes around a payload for delays up to three days, where a JSON object spent
42. With a 100-byte payload that is what keeps the hash value in jemalloc's 128-byte size class
rather than the 160-byte one. The queue name lives in the key and the attempt in its own hash.
Payloads are JSON only: nothing read from Redis is ever unpickled or evaluated. Envelopes
written by earlier versions (a JSON object ``{"d":due,"s":scheduled,"p":payload}``) are still
read.
"""

from __future__ import annotations

import json
import os
import re
from base64 import urlsafe_b64encode
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django_delayqueue.core.errors import CorruptEnvelope, PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024
MAX_ID_LENGTH = 200

# "<due>,<due - scheduled>," in hex; the same pattern as envelope_times() in
# lua/includes/envelope.lua.
_HEAD = re.compile(r"(-?[0-9a-fA-F]+),(-?[0-9a-fA-F]+),")
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


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
    """JSON-encode a payload, refusing what is not JSON or is larger than ``max_bytes``."""
    try:
        text = _encode(payload)
    except (TypeError, ValueError) as e:
        raise PayloadError(f"payload is not JSON-serialisable: {e}") from e
    size = len(text.encode("utf-8")) if not text.isascii() else len(text)
    if size > max_bytes:
        raise PayloadError(
            f"payload is {size} bytes of JSON, over the {max_bytes}-byte limit (max_payload_bytes)"
        )
    return text


def encode_envelope(payload_json: str, due_ms: int, scheduled_ms: int) -> str:
    due = int(due_ms)
    return f"{due:x},{due - int(scheduled_ms):x},{payload_json}"


def decode_envelope(raw: bytes | str | None) -> tuple[int, int, Any]:
    """Return ``(due_ms, scheduled_ms, payload)``; raise :class:`CorruptEnvelope` otherwise."""
    if raw is None or raw == b"" or raw == "":
        raise CorruptEnvelope("corrupt: envelope missing")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if text.startswith("{"):
        return _decode_json_envelope(raw)
    head = _HEAD.match(text)
    if head is None:
        raise CorruptEnvelope("corrupt: envelope does not start with hex due and lead times")
    due, lead = int(head[1], 16), int(head[2], 16)
    try:
        payload = json.loads(text[head.end() :])
    except ValueError as e:
        raise CorruptEnvelope(f"corrupt: envelope payload is not JSON ({e})") from e
    return due, due - lead, payload


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

    @property
    def due_at(self) -> datetime:
        return ms_to_datetime(self.due_ms)

    @property
    def scheduled_at(self) -> datetime:
        return ms_to_datetime(self.scheduled_ms)


def to_str(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
