"""Pure DataFrame -> DataFrame steps that turn rows of data into messages (or rejects).

:func:`prepare` adds six columns to the input: ``dq_id``, ``dq_due_ms``, ``dq_payload``
(JSON), ``dq_unique_ms`` (the row's uniqueness window in ms, 0 for none), ``dq_key`` (the row's
flow key, null for none) and ``dq_reason`` (``None`` for a good row, else why the row cannot be
scheduled).
:func:`split` separates the good rows from the rejects. Nothing here touches Redis or files.

Ids must be deterministic so that a re-run (or a retried Spark task) schedules nothing twice:
take them from a column, or derive them with :func:`derived_id` (SHA-1 of chosen columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from django_delayqueue.core.envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ID_LENGTH,
    MAX_KEY_LENGTH,
    MAX_PAYLOAD_DEPTH,
)
from django_delayqueue.core.errors import ConfigurationError

ID, DUE, PAYLOAD, REASON = "dq_id", "dq_due_ms", "dq_payload", "dq_reason"
UNIQUE, KEY = "dq_unique_ms", "dq_key"
OUTPUT_COLUMNS = (ID, DUE, PAYLOAD, UNIQUE, KEY, REASON)

# What Python's str.isprintable() refuses, in Java regex terms (the core's validate_id runs
# again on the executors, so a character class the two disagree on is still caught there).
_BAD_ID_CHARS = r"[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]|[\p{Zs}&&[^ ]]|^\s|\s$"
_ID_SEPARATOR = "\u001f"  # unit separator: cannot occur in the printable values it joins
_NULL_MARK = "\u0000"

MISSING_ID = "missing id"
ID_TOO_LONG = f"bad id: longer than {MAX_ID_LENGTH} characters"
BAD_ID_CHARS = "bad id: control characters or leading/trailing spaces"
MISSING_DUE = "missing due time"
BAD_DUE = "bad due time: not a timestamp"
MISSING_DELAY = "missing delay"
BAD_DELAY = "bad delay: not a number of seconds >= 0"
BAD_UNIQUE_FOR = "bad unique_for: not a number of seconds > 0"
EMPTY_KEY = "bad key: empty (null for no key)"
KEY_TOO_LONG = f"bad key: longer than {MAX_KEY_LENGTH} characters"
# Found by the executors (they know the shards): every message of a key lives on its key's shard,
# and a row's id, deterministic for re-runs, cannot be made up to route there.
KEY_SHARD = "bad id for its key: a sharded queue keeps a key's messages on the key's shard"
NOT_JSON = "payload not serialisable: NaN or Infinity in column "
TOO_LARGE = "payload too large: over max_payload_bytes="


@dataclass(frozen=True)
class MessageSpec:
    """Which columns make the id, the due time and the payload of each message.

    Give ``id_column`` or ``id_from``; give ``due_column`` (a timestamp, a date, a string
    Spark can read as a timestamp, or epoch milliseconds) or ``delay_column`` (seconds from
    ``now``), or neither for "due now". ``payload_columns`` empty means every column.
    ``unique_for_column``: a column of seconds, each row's uniqueness window (as
    ``schedule(..., unique_for=)``; null for none). ``key_column``: each row's flow key (as
    ``schedule(..., key=)``; null for none; numbers are taken as their text).
    """

    id_column: str | None = None
    id_from: tuple[str, ...] = ()
    due_column: str | None = None
    delay_column: str | None = None
    payload_columns: tuple[str, ...] = ()
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    unique_for_column: str | None = None
    key_column: str | None = None

    def check(self, columns: Sequence[str]) -> None:
        """Raise ConfigurationError when the spec does not fit a DataFrame's ``columns``."""
        if bool(self.id_column) == bool(self.id_from):
            raise ConfigurationError("give an id column or columns to derive the id from")
        if self.due_column and self.delay_column:
            raise ConfigurationError("give a due-time column or a delay column, not both")
        if self.max_payload_bytes < 1:
            raise ConfigurationError("max_payload_bytes must be at least 1")
        named = [
            self.id_column,
            *self.id_from,
            self.due_column,
            self.delay_column,
            self.unique_for_column,
            self.key_column,
        ]
        missing = sorted({c for c in [*named, *self.payload_columns] if c and c not in columns})
        if missing:
            raise ConfigurationError(
                f"no such column(s): {', '.join(missing)}; the input has {', '.join(columns)}"
            )
        clash = sorted(set(OUTPUT_COLUMNS) & set(columns))
        if clash:
            raise ConfigurationError(f"the input already has column(s) {', '.join(clash)}")


def derived_id(df: DataFrame, columns: Sequence[str]) -> Column:
    """SHA-1 (hex) of the values of ``columns``; null when any of them is null.

    Timestamps enter as epoch microseconds so that the id does not depend on the session's
    time zone; other values as their string form.
    """
    types = dict(df.dtypes)
    parts = []
    for name in columns:
        column = F.col(name)
        if types[name] in ("timestamp", "timestamp_ntz"):
            column = F.unix_micros(column.cast("timestamp"))
        parts.append(F.coalesce(column.cast("string"), F.lit(_NULL_MARK)))
    any_null = F.lit(False)
    for name in columns:
        any_null = any_null | F.col(name).isNull()
    digest = F.sha1(F.concat_ws(_ID_SEPARATOR, *parts))
    return F.when(any_null, F.lit(None).cast("string")).otherwise(digest)


def due_ms(df: DataFrame, spec: MessageSpec, now_ms: int) -> tuple[Column, Column]:
    """``(due time in epoch ms, reason or null)`` for each row."""
    now = F.lit(int(now_ms)).cast("long")
    if spec.delay_column:
        raw = F.col(spec.delay_column)
        seconds = raw.try_cast("double")
        bad = seconds.isNull() | F.isnan(seconds) | (seconds < 0) | (seconds > 1e13)
        reason = F.when(raw.isNull(), F.lit(MISSING_DELAY)).when(bad, F.lit(BAD_DELAY))
        # Rounded up (never early), after rounding away float noise (0.29 * 1000 is
        # 290.00000000000006, not 291 ms).
        return now + F.ceil(F.round(seconds * 1000, 6)).try_cast("long"), reason
    if not spec.due_column:
        return now, F.lit(None).cast("string")
    raw = F.col(spec.due_column)
    kind = df.schema[spec.due_column].dataType
    if isinstance(kind, (T.TimestampType, T.TimestampNTZType, T.DateType)):
        due = F.unix_millis(raw.cast("timestamp"))
    elif isinstance(kind, T.NumericType):
        due = F.when(~F.isnan(raw.cast("double")), raw.try_cast("long"))
    else:
        due = F.unix_millis(F.try_to_timestamp(raw.cast("string")))
    reason = F.when(raw.isNull(), F.lit(MISSING_DUE)).when(due.isNull(), F.lit(BAD_DUE))
    return due, reason


def unique_ms(spec: MessageSpec) -> tuple[Column, Column]:
    """``(uniqueness window in ms, reason or null)``: 0 when there is no window (no column, or
    null in it); rounded up to whole ms as the core rounds it (core.uniqueness)."""
    if not spec.unique_for_column:
        return F.lit(0).cast("long"), F.lit(None).cast("string")
    raw = F.col(spec.unique_for_column)
    seconds = raw.try_cast("double")
    rounded = F.round(seconds * 1000, 6)
    # A tiny positive window that rounds to 0 ms is bad, as the core refuses it: as a 0 it
    # would be taken for no window at all.
    bad = raw.isNotNull() & (
        seconds.isNull() | F.isnan(seconds) | (rounded <= 0) | (seconds > 1e11)
    )
    window = F.when(raw.isNull() | bad, F.lit(0)).otherwise(F.ceil(rounded).try_cast("long"))
    return window.cast("long"), F.when(bad, F.lit(BAD_UNIQUE_FOR))


def flow_key(spec: MessageSpec) -> tuple[Column, Column]:
    """``(flow key or null, reason or null)``: what the core's ``validate_key`` refuses of a
    string (empty, too long) is a reason here; the executors run it again for the rest."""
    if not spec.key_column:
        return F.lit(None).cast("string"), F.lit(None).cast("string")
    key = F.col(spec.key_column).cast("string")
    reason = F.when(key == "", F.lit(EMPTY_KEY)).when(
        F.length(key) > MAX_KEY_LENGTH, F.lit(KEY_TOO_LONG)
    )
    return key, reason


def payload_json(df: DataFrame, spec: MessageSpec) -> tuple[Column, Column]:
    """``(payload JSON, reason or null)``: nulls are kept as JSON null, NaN/Infinity refused."""
    names = list(spec.payload_columns) or list(df.columns)
    depth = payload_depth(df.schema, names)
    if depth > MAX_PAYLOAD_DEPTH:  # what the core refuses of any payload: see its envelope
        raise ConfigurationError(
            f"payload columns nest arrays and objects {depth} levels deep, over the "
            f"{MAX_PAYLOAD_DEPTH} that every consumer can decode"
        )
    payload = F.to_json(F.struct(*[F.col(n) for n in names]), {"ignoreNullFields": "false"})
    reason = F.lit(None).cast("string")
    floats = [f.name for f in df.schema.fields if f.name in names and _is_float(f.dataType)]
    for name in reversed(floats):  # the first offending column wins
        value = F.col(name).cast("double")
        not_finite = F.isnan(value) | (F.abs(value) == float("inf"))
        reason = F.when(not_finite, F.lit(NOT_JSON + name)).otherwise(reason)
    too_large = F.octet_length(payload) > spec.max_payload_bytes
    reason = F.coalesce(reason, F.when(too_large, F.lit(f"{TOO_LARGE}{spec.max_payload_bytes}")))
    return payload, reason


def payload_depth(schema: T.StructType, names: Sequence[str]) -> int:
    """How deeply the JSON of ``names`` (one object of those columns) can nest, at most."""
    return 1 + max((_type_depth(schema[n].dataType) for n in names), default=0)


def _type_depth(data_type: T.DataType) -> int:
    if isinstance(data_type, T.StructType):
        return 1 + max((_type_depth(f.dataType) for f in data_type.fields), default=0)
    if isinstance(data_type, T.ArrayType):
        return 1 + _type_depth(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return 1 + _type_depth(data_type.valueType)
    return 0


def id_reason(message_id: Column) -> Column:
    """Why an id cannot be used (or null), mirroring the core's ``validate_id``."""
    return (
        F.when(message_id.isNull() | (message_id == ""), F.lit(MISSING_ID))
        .when(F.length(message_id) > MAX_ID_LENGTH, F.lit(ID_TOO_LONG))
        .when(message_id.rlike(_BAD_ID_CHARS), F.lit(BAD_ID_CHARS))
    )


def prepare(df: DataFrame, spec: MessageSpec, now_ms: int) -> DataFrame:
    """Add ``dq_id``, ``dq_due_ms``, ``dq_payload``, ``dq_unique_ms``, ``dq_key`` and
    ``dq_reason`` to every row."""
    spec.check(df.columns)
    if spec.id_column:
        message_id = F.col(spec.id_column).cast("string")
    else:
        message_id = derived_id(df, spec.id_from)
    due, due_reason = due_ms(df, spec, now_ms)
    payload, payload_reason = payload_json(df, spec)
    window, window_reason = unique_ms(spec)
    key, key_reason = flow_key(spec)
    with_id = df.withColumn(ID, message_id)
    reason = F.coalesce(id_reason(F.col(ID)), due_reason, payload_reason, window_reason, key_reason)
    return (
        with_id.withColumn(DUE, due)
        .withColumn(PAYLOAD, payload)
        .withColumn(UNIQUE, window)
        .withColumn(KEY, key)
        .withColumn(REASON, reason)
    )


def split(prepared: DataFrame) -> tuple[DataFrame, DataFrame]:
    """``(good, rejects)``: good rows as (id, due ms, payload, window ms, key); rejects as
    input + id + reason."""
    good = prepared.where(F.col(REASON).isNull()).select(ID, DUE, PAYLOAD, UNIQUE, KEY)
    rejects = prepared.where(F.col(REASON).isNotNull()).drop(DUE, PAYLOAD, UNIQUE, KEY)
    return good, rejects


def _is_float(data_type: T.DataType) -> bool:
    return isinstance(data_type, (T.FloatType, T.DoubleType))
