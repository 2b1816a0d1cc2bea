"""django_delayqueue.core.envelope: JSON-only payloads, the stored envelope, message ids."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from django_delayqueue.core import CorruptEnvelope, Message, PayloadError
from django_delayqueue.core.envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ID_LENGTH,
    MAX_PAYLOAD_DEPTH,
    decode_envelope,
    encode_envelope,
    encode_json,
    encode_payload,
    new_id,
    storable_text,
    to_str,
    validate_id,
)


def test_default_payload_limit_is_512_kib() -> None:
    assert DEFAULT_MAX_PAYLOAD_BYTES == 512 * 1024


@pytest.mark.parametrize(
    "payload", [None, 1, 1.5, "text", [1, "a"], {"order": 42, "tags": ["x"], "nested": {"a": None}}]
)
def test_json_payloads_round_trip(payload: object) -> None:
    text = encode_payload(payload)
    assert json.loads(text) == payload
    envelope = encode_envelope(text, 2_000, 1_000)
    assert decode_envelope(envelope) == (2_000, 1_000, payload)
    assert decode_envelope(envelope.encode()) == (2_000, 1_000, payload)


def test_envelope_is_hex_due_and_lead_then_the_payload() -> None:
    envelope = encode_envelope(encode_payload({"a": 1}), 1_700_000_030_000, 1_700_000_000_000)
    assert envelope == '18bcfe5dd30,7530,{"a":1}'  # due, 30 000 ms lead, payload
    assert decode_envelope(envelope) == (1_700_000_030_000, 1_700_000_000_000, {"a": 1})


def test_envelope_of_a_100_byte_payload_fits_jemallocs_128_byte_class() -> None:
    # 3 bytes of sds header and a terminating NUL besides the text: 124 characters at most.
    payload = encode_payload("x" * 98)
    assert len(payload) == 100
    day_ms = 86_400_000
    envelope = encode_envelope(payload, 1_800_000_000_000 + 3 * day_ms, 1_800_000_000_000)
    assert len(envelope) <= 124


def test_due_before_scheduled_and_negative_times_round_trip() -> None:
    for due, scheduled in [(1_000, 5_000), (-20, 10), (0, 0)]:
        assert decode_envelope(encode_envelope("null", due, scheduled)) == (due, scheduled, None)


def test_envelopes_of_earlier_versions_are_still_read() -> None:
    assert decode_envelope(b'{"d":5,"s":3,"p":{"a":1}}') == (5, 3, {"a": 1})


def test_non_ascii_is_kept_as_is() -> None:
    assert encode_payload("café") == '"café"'


@pytest.mark.parametrize(
    "payload",
    [object(), {1, 2}, b"bytes", Decimal("1.5"), datetime.now(tz=timezone.utc), {"k": object()}],
)
def test_non_json_payload_is_refused_naming_the_problem(payload: object) -> None:
    with pytest.raises(PayloadError, match="payload is not JSON-serialisable") as info:
        encode_payload(payload)
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused(value: float) -> None:
    # Python's json would write NaN/Infinity, which is not JSON and other readers reject.
    with pytest.raises(PayloadError, match="JSON-serialisable"):
        encode_payload({"x": value})


def test_payload_at_the_limit_is_accepted_and_one_byte_more_is_refused() -> None:
    limit = 100
    fits = "x" * (limit - 2)  # two quote characters
    assert len(encode_payload(fits, limit)) == limit
    with pytest.raises(PayloadError) as info:
        encode_payload(fits + "x", limit)
    message = str(info.value)
    assert "101 bytes" in message and "100-byte limit" in message
    assert "max_payload_bytes" in message


def test_default_limit_refuses_a_payload_over_512_kib() -> None:
    with pytest.raises(PayloadError, match="524288-byte limit"):
        encode_payload("x" * DEFAULT_MAX_PAYLOAD_BYTES)


def test_size_is_counted_in_utf8_bytes_not_characters() -> None:
    text = "é" * 60  # 60 characters, 120 bytes, plus two quotes
    with pytest.raises(PayloadError, match="122 bytes"):
        encode_payload(text, 100)


# --- what every consumer can decode again: nesting, surrogates, huge ints --------------------


def nested(depth: int, kind: str = "list") -> Any:
    """A value nesting ``depth`` levels of arrays and/or objects around 1."""
    value: Any = 1
    for level in range(depth):
        shape = kind if kind != "mixed" else ("list", "dict", "tuple")[level % 3]
        value = {"k": value} if shape == "dict" else (value,) if shape == "tuple" else [value]
    return value


def at_stack_depth(frames: int, call: Callable[[], Any]) -> Any:
    """``call()`` made with ``frames`` frames on the stack, as in a deep consumer."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return _deeper(frames - depth, call)


def _deeper(left: int, call: Callable[[], Any]) -> Any:
    return call() if left <= 0 else _deeper(left - 1, call)


@pytest.mark.parametrize("kind", ["list", "dict", "tuple", "mixed"])
def test_a_payload_at_the_depth_limit_decodes_in_a_consumer_with_a_deep_stack(kind: str) -> None:
    text = encode_payload(nested(MAX_PAYLOAD_DEPTH, kind))
    envelope = encode_envelope(text, 2_000, 1_000)
    # What the limit is for: whatever the producer's stack, a consumer with up to 750 frames of
    # its own (under the default recursion limit of 1000) decodes it.
    frames = sys.getrecursionlimit() - MAX_PAYLOAD_DEPTH - 50
    due, _, payload = at_stack_depth(frames, lambda: decode_envelope(envelope))
    assert due == 2_000 and payload == json.loads(text)


@pytest.mark.parametrize("kind", ["list", "dict", "tuple", "mixed"])
@pytest.mark.parametrize("depth", [MAX_PAYLOAD_DEPTH + 1, 990, 5_000])
def test_a_payload_nested_deeper_than_the_limit_is_refused(kind: str, depth: int) -> None:
    # Before: 990 levels were accepted from a shallow stack (and raised RecursionError in the
    # consumer); 5000 raised RecursionError here, not a PayloadError.
    with pytest.raises(PayloadError, match="more than 200 levels deep"):
        encode_payload(nested(depth, kind))


def test_many_brackets_that_do_not_nest_deeply_are_accepted() -> None:
    shallow = {"rows": [[i, {"x": [i]}] for i in range(1_000)], "text": "[{" * 1_000}
    assert json.loads(encode_payload(shallow)) == shallow


@pytest.mark.parametrize(
    "payload",
    ["\udcff", {"name": "report-\udcff.pdf"}, {"\ud800": 1}, [["x", "\udfff"]], "é\ud83d"],
)
def test_a_lone_surrogate_is_a_payload_error(payload: object) -> None:
    # What os.fsdecode makes of an undecodable file name. Before: UnicodeEncodeError.
    with pytest.raises(PayloadError, match=r"lone surrogate .* not valid UTF-8"):
        encode_payload(payload)


def test_a_surrogate_pair_written_as_one_character_is_fine() -> None:
    assert json.loads(encode_payload("\U0001f600")) == "\U0001f600"


def test_ascii_only_json_keeps_a_lone_surrogate_as_an_escape() -> None:
    text = encode_json({"name": "\udcff"}, "return value", ascii_only=True)
    assert text == '{"name":"\\udcff"}' and json.loads(text) == {"name": "\udcff"}
    with pytest.raises(PayloadError, match=r"^return value nests"):
        encode_json(nested(MAX_PAYLOAD_DEPTH + 1), "return value", ascii_only=True)


def test_an_int_past_pythons_int_string_limit_is_refused() -> None:
    # The consumer could not decode it (json.loads raises ValueError past 4300 digits).
    with pytest.raises(PayloadError, match=r"JSON-serialisable.*integer string conversion"):
        encode_payload({"n": 10**5000})


@pytest.mark.parametrize(
    "raw,problem",
    [
        ("1f,1," + "[" * 100_000 + "]" * 100_000, "nests too deeply to decode"),
        ('{"d":1,"s":1,"p":' + "[" * 100_000 + "]" * 100_000 + "}", "nests too deeply"),
        ("1f,1," + "9" * 5_000, "payload is not JSON"),
    ],
    ids=["too-deep", "too-deep-old-form", "huge-int"],
)
def test_an_envelope_that_cannot_be_decoded_is_corrupt(raw: str, problem: str) -> None:
    # Before: the deep ones raised RecursionError, which failed a consumer's whole round.
    with pytest.raises(CorruptEnvelope, match=problem):
        decode_envelope(raw)
    with pytest.raises(CorruptEnvelope, match=problem):
        decode_envelope(raw.encode())


@pytest.mark.parametrize(
    "raw,problem",
    [
        (None, "missing"),
        (b"", "missing"),
        ("", "missing"),
        (b"\xff\xfe", "does not start with hex due and lead times"),
        (b"[1, 2]", "does not start with hex due and lead times"),
        (b'"a string"', "does not start with hex due and lead times"),
        (b"soon,1,{}", "does not start with hex due and lead times"),
        (b"1f,1,", "payload is not JSON"),
        (b"1f,1,{oops", "payload is not JSON"),
        (b"{not json", "not JSON"),  # the JSON object form of earlier versions
        (b'{"d": 1, "s": 1}', "not an object with a payload"),
        (b'{"p": 1}', "not integers"),
        (b'{"d": "soon", "s": 1, "p": 1}', "not integers"),
        (b'{"d": 1.5, "s": 1, "p": 1}', "not integers"),
    ],
)
def test_corrupt_envelopes_are_reported(raw: bytes | str | None, problem: str) -> None:
    with pytest.raises(CorruptEnvelope) as info:
        decode_envelope(raw)
    assert str(info.value).startswith("corrupt")
    assert problem in str(info.value)


def test_new_ids_are_short_and_unique() -> None:
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 12 and validate_id(i) == i for i in ids)


@pytest.mark.parametrize("good", ["order-42", "a", "x" * MAX_ID_LENGTH, "spaces inside ok"])
def test_valid_ids_are_returned(good: str) -> None:
    assert validate_id(good) == good


@pytest.mark.parametrize(
    "bad,problem",
    [
        ("", "non-empty string"),
        (42, "non-empty string"),
        (None, "non-empty string"),
        ("x" * (MAX_ID_LENGTH + 1), "over 200"),
        ("tab\there", "control characters"),
        (" edge", "edge spaces"),
        ("edge ", "edge spaces"),
    ],
)
def test_invalid_ids_are_refused(bad: object, problem: str) -> None:
    with pytest.raises(PayloadError, match=problem):
        validate_id(bad)


def test_message_exposes_times_as_aware_datetimes() -> None:
    m = Message("id", "q", {"a": 1}, due_ms=1_700_000_000_500, scheduled_ms=0, attempt=1)
    assert m.due_at == datetime(2023, 11, 14, 22, 13, 20, 500_000, tzinfo=timezone.utc)
    assert m.scheduled_at == datetime(1970, 1, 1, tzinfo=timezone.utc)


def test_to_str_decodes_bytes_and_keeps_str() -> None:
    assert to_str(b"abc") == "abc"
    assert to_str("abc") == "abc"
    assert to_str(b"\xff") == "\ufffd"


@pytest.mark.parametrize(
    "text,stored",
    [
        ("café ☕", "café ☕"),  # non-ASCII text is kept as it is
        ("r\udcffport.pdf", "r\\udcffport.pdf"),  # a lone surrogate is escaped, not an error
        ("x" * 3_000, "x" * 2_000),
        (None, "None"),  # a Reject(None): text, not a TypeError in the consumer's recording
    ],
)
def test_storable_text_is_bounded_utf8(text: Any, stored: str) -> None:
    assert storable_text(text, 2_000) == stored
    assert storable_text(text, 2_000).encode("utf-8")
