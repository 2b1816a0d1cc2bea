"""django_delayqueue.spark.transforms: ids, due times, payloads and reasons, on tiny frames."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import types as T

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.spark import transforms as t
from django_delayqueue.spark.transforms import PAYLOAD, MessageSpec, prepare, split

NOW = 1_700_000_000_000


def rows(spark: Any, schema: str, data: list[tuple]) -> Any:
    return spark.createDataFrame(data, schema)


def prepared(df: Any, spec: MessageSpec) -> dict[Any, dict[str, Any]]:
    return {r[t.ID]: r.asDict() for r in prepare(df, spec, NOW).collect()}


def test_ids_from_a_column_and_due_times_from_timestamps_dates_and_epoch_ms(spark: Any) -> None:
    at = datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)
    df = rows(spark, "key long, at timestamp", [(1, at), (2, None)])
    out = prepared(df, MessageSpec(id_column="key", due_column="at"))
    assert out["1"][t.DUE] == int(at.timestamp() * 1000)
    assert out["1"][t.REASON] is None
    assert out["2"][t.REASON] == t.MISSING_DUE

    epoch = rows(spark, "key string, due long", [("a", 1_800_000_000_123)])
    assert prepared(epoch, MessageSpec(id_column="key", due_column="due"))["a"][t.DUE] == (
        1_800_000_000_123
    )
    text = rows(spark, "key string, due string", [("a", "2024-05-01 12:30:00"), ("b", "soon")])
    out = prepared(text, MessageSpec(id_column="key", due_column="due"))
    assert out["a"][t.DUE] == int(at.timestamp() * 1000)  # the session time zone is UTC
    assert out["b"][t.REASON] == t.BAD_DUE


def test_delays_are_seconds_from_now_and_bad_ones_are_refused(spark: Any) -> None:
    df = rows(
        spark,
        "key string, delay double",
        [
            ("ok", 1.5),
            ("zero", 0.0),
            ("none", None),
            ("neg", -1.0),
            ("nan", float("nan")),
            ("sub-ms", 0.0012),
            ("float noise", 0.29),
        ],
    )
    out = prepared(df, MessageSpec(id_column="key", delay_column="delay"))
    assert out["ok"][t.DUE] == NOW + 1500
    assert out["sub-ms"][t.DUE] == NOW + 2  # rounded up: never before the instant asked for
    assert out["float noise"][t.DUE] == NOW + 290  # 0.29 * 1000 is 290.00000000000006
    assert out["zero"][t.DUE] == NOW and out["zero"][t.REASON] is None
    assert out["none"][t.REASON] == t.MISSING_DELAY
    assert out["neg"][t.REASON] == t.BAD_DELAY
    assert out["nan"][t.REASON] == t.BAD_DELAY


def test_derived_ids_are_sha1_of_the_values_and_stable(spark: Any) -> None:
    df = rows(spark, "store long, day string", [(7, "2024-05-01"), (7, "2024-05-02"), (None, "x")])
    spec = MessageSpec(id_from=("store", "day"))
    first = prepare(df, spec, NOW).collect()
    again = prepare(df, spec, NOW + 99).collect()
    assert [r[t.ID] for r in first] == [r[t.ID] for r in again]
    expected = hashlib.sha1(b"7\x1f2024-05-01").hexdigest()
    assert first[0][t.ID] == expected
    assert first[0][t.ID] != first[1][t.ID]
    assert first[2][t.ID] is None and first[2][t.REASON] == t.MISSING_ID


def test_bad_ids_get_a_reason(spark: Any) -> None:
    data = [("",), (None,), ("x" * 201,), ("tab\there",), (" edge",), ("fine-id:1",)]
    df = rows(spark, "key string", data)
    reasons = [r[t.REASON] for r in prepare(df, MessageSpec(id_column="key"), NOW).collect()]
    assert reasons == [
        t.MISSING_ID,
        t.MISSING_ID,
        t.ID_TOO_LONG,
        t.BAD_ID_CHARS,
        t.BAD_ID_CHARS,
        None,
    ]


def test_payload_is_json_of_the_chosen_columns_with_nulls_kept(spark: Any) -> None:
    df = rows(
        spark, "key string, amount double, note string, secret string", [("a", 2.5, None, "s")]
    )
    spec = MessageSpec(id_column="key", payload_columns=("key", "amount", "note"))
    payload = prepared(df, spec)["a"][t.PAYLOAD]
    assert json.loads(payload) == {"key": "a", "amount": 2.5, "note": None}


def test_nan_payloads_and_oversized_payloads_are_refused(spark: Any) -> None:
    df = rows(
        spark,
        "key string, x double, text string",
        [("nan", float("nan"), "a"), ("inf", float("inf"), "a"), ("big", 1.0, "y" * 100)],
    )
    out = prepared(df, MessageSpec(id_column="key", max_payload_bytes=60))
    assert out["nan"][t.REASON] == t.NOT_JSON + "x"
    assert out["inf"][t.REASON] == t.NOT_JSON + "x"
    assert out["big"][t.REASON] == t.TOO_LARGE + "60"


def test_a_uniqueness_window_column_becomes_whole_milliseconds_or_a_reason(spark: Any) -> None:
    df = rows(
        spark,
        "key string, window string",
        [
            ("a", "86400"),
            ("b", "0.29"),
            ("c", None),
            ("d", "0"),
            ("e", "-1"),
            ("f", "soon"),
            ("g", "1e-10"),  # rounds to 0 ms: the core refuses it too
        ],
    )
    spec = MessageSpec(id_column="key", unique_for_column="window")
    out = {r[t.ID]: (r[t.UNIQUE], r[t.REASON]) for r in prepare(df, spec, NOW).collect()}
    assert out["a"] == (86_400_000, None)
    assert out["b"] == (290, None)  # rounded as the core rounds it, float noise ignored
    assert out["c"] == (0, None)  # null: no window
    assert {out[k][1] for k in "defg"} == {t.BAD_UNIQUE_FOR}
    no_column = prepare(df, MessageSpec(id_column="key"), NOW).collect()
    assert {r[t.UNIQUE] for r in no_column} == {0}


def test_split_keeps_the_input_row_with_its_reason(spark: Any) -> None:
    df = rows(spark, "key string, delay int", [("a", 5), ("b", None)])
    good, rejects = split(prepare(df, MessageSpec(id_column="key", delay_column="delay"), NOW))
    assert [(r[t.ID], r[t.DUE]) for r in good.collect()] == [("a", NOW + 5000)]
    assert good.columns == [t.ID, t.DUE, t.PAYLOAD, t.UNIQUE, t.KEY]
    rejected = [r.asDict() for r in rejects.collect()]
    assert rejected == [{"key": "b", "delay": None, t.ID: "b", t.REASON: t.MISSING_DELAY}]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (MessageSpec(), "id column"),
        (MessageSpec(id_column="key", id_from=("key",)), "id column"),
        (MessageSpec(id_column="nope"), "no such column"),
        (MessageSpec(id_column="key", due_column="d", delay_column="d"), "not both"),
    ],
)
def test_a_spec_that_does_not_fit_is_a_configuration_error(
    spark: Any, spec: MessageSpec, message: str
) -> None:
    df = rows(spark, "key string, d long", [("a", 1)])
    with pytest.raises(ConfigurationError, match=message):
        prepare(df, spec, NOW)


def nested_array(levels: int) -> str:
    return "array<" * levels + "int" + ">" * levels


def test_payload_depth_counts_the_object_and_every_nested_type() -> None:
    schema = T.StructType(
        [
            T.StructField("flat", T.LongType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("m", T.MapType(T.StringType(), T.ArrayType(T.StructType([])))),
        ]
    )
    assert t.payload_depth(schema, ["flat"]) == 1  # {"flat": 1}
    assert t.payload_depth(schema, ["flat", "tags"]) == 2  # {"tags": ["a"]}
    assert t.payload_depth(schema, ["m"]) == 4  # {"m": {"k": [{}]}}


@pytest.mark.parametrize("levels,refused", [(199, False), (200, True)])
def test_payload_columns_nested_deeper_than_a_consumer_decodes_are_refused(
    spark: Any, levels: int, refused: bool
) -> None:
    df = rows(spark, f"key string, deep {nested_array(levels)}", [])
    spec = MessageSpec(id_column="key")
    if refused:  # one level for the payload's own object: 201
        with pytest.raises(ConfigurationError, match="201 levels deep, over the 200"):
            prepare(df, spec, NOW)
    else:
        assert PAYLOAD in prepare(df, spec, NOW).columns
