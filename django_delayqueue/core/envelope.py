"""The JSON envelope stored per message, and the :class:`Message` a handler receives.

The stored envelope is compact (``{"d":due,"s":scheduled,"p":payload}``) because it is the bulk
of a pending message's memory; the queue name lives in the key and the attempt in its own hash.
Payloads are JSON only: nothing read from Redis is ever unpickled or evaluated.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .errors import CorruptEnvelope, PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024
MAX_ID_LENGTH = 200

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def new_id() -> str:
    """A random message id: 96 bits, 16 URL-safe characters (short keeps memory down)."""
    return secrets.token_urlsafe(12)


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
    return f'{{"d":{int(due_ms)},"s":{int(scheduled_ms)},"p":{payload_json}}}'


def decode_envelope(raw: bytes | str | None) -> tuple[int, int, Any]:
    """Return ``(due_ms, scheduled_ms, payload)``; raise :class:`CorruptEnvelope` otherwise."""
    if raw is None or raw == b"" or raw == "":
        raise CorruptEnvelope("corrupt: envelope missing")
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
