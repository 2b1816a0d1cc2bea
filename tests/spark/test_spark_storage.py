"""django_delayqueue.spark.storage and the cluster rules of the Spark commands: URIs reach Spark
unchanged, the driver's own files go through Hadoop's FileSystem, counts never read files back,
and a cluster run refuses what would scatter rows or reach the wrong Redis."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_delayqueue.spark.storage import has_scheme, is_local_master, join

QUEUE = "order-close"


@pytest.mark.parametrize(
    ("base", "parts", "joined"),
    [
        ("s3a://bucket/shop", ("orders",), "s3a://bucket/shop/orders"),
        ("s3a://bucket", ("shop/", "/orders"), "s3a://bucket/shop/orders"),
        ("hdfs://nn:8020/x/", ("parquet", "hourly"), "hdfs://nn:8020/x/parquet/hourly"),
        ("file:///data", ("r.csv",), "file:///data/r.csv"),
        ("/tmp/shop", ("orders",), "/tmp/shop/orders"),
        ("relative/dir", ("charts", "q-lateness.png"), "relative/dir/charts/q-lateness.png"),
    ],
)
def test_join_keeps_the_scheme_and_the_authority(
    base: str, parts: tuple[str, ...], joined: str
) -> None:
    assert join(base, *parts) == joined


def test_schemes_and_masters() -> None:
    assert has_scheme("s3a://b/x") and has_scheme("hdfs://nn/x") and has_scheme("file:/x")
    assert not has_scheme("/tmp/x") and not has_scheme("rel/x") and not has_scheme("C:\\data")
    assert is_local_master("local[*]") and is_local_master("local")
    assert not is_local_master("spark://10.0.0.5:7077") and not is_local_master("yarn")


class Reached(Exception):
    """Raised where Python hands a path to Spark, carrying what Spark would have got."""


@pytest.mark.parametrize("base", ["s3a://bucket/shop", "hdfs://nn:8020/shop"])
def test_uris_reach_spark_unchanged(
    spark: Any, base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import DataFrameReader, DataFrameWriter

    from django_delayqueue.spark.bulk import read_input

    def reach(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        raise Reached(path)

    monkeypatch.setattr(DataFrameReader, "load", reach)
    monkeypatch.setattr(DataFrameWriter, "save", reach)
    with pytest.raises(Reached) as read:
        read_input(spark, f"{base}/orders", "parquet")
    assert read.value.args == (f"{base}/orders",)
    with pytest.raises(Reached) as written:
        call_command("demo_dataset", "--orders", "10", "--out", base, stdout=StringIO())
    assert written.value.args == (f"{base}/orders",)  # not s3a:/bucket/... nor hdfs:/nn:8020/...


def test_write_job_keeps_uris_and_resolves_the_settings(tmp_path: Path) -> None:
    job_file = tmp_path / "job.json"
    out = StringIO()
    call_command(
        "schedule_bulk", "--input", "s3a://bucket/shop/orders", "--queue", QUEUE,
        "--id-column", "order_ref", "--due-column", "close_at", "--unique-for-column", "window",
        "--rejects", "hdfs://nn:8020/shop/rejects", "--redis-url", "redis://redis.internal/0",
        "--write-job", str(job_file), stdout=out,
    )  # fmt: skip
    job = json.loads(job_file.read_text())
    assert (job["input"], job["rejects"]) == (
        "s3a://bucket/shop/orders",
        "hdfs://nn:8020/shop/rejects",
    )
    assert (job["queue"], job["prefix"], job["redis_url"]) == (
        QUEUE,
        "dq",
        "redis://redis.internal/0",
    )
    assert job["spec"]["max_payload_bytes"] > 0 and job["spec"]["id_column"] == "order_ref"
    assert job["spec"]["unique_for_column"] == "window"
    assert "job written to" in out.getvalue()


def test_a_cluster_run_refuses_the_default_redis_and_a_missing_rejects_path(tmp_path: Path) -> None:
    base = ["schedule_bulk", "--input", str(tmp_path), "--queue", QUEUE, "--id-column", "x"]
    cluster = ["--master", "spark://127.0.0.1:9"]  # refused before any Spark is started
    with pytest.raises(CommandError, match="give --rejects"):
        call_command(*base, *cluster)
    no_url = {**settings.DELAYQUEUE, "REDIS_URL": None}
    with override_settings(DELAYQUEUE=no_url), pytest.raises(CommandError, match="no Redis URL"):
        call_command(*base, *cluster, "--rejects", str(tmp_path / "r"))


def test_rejects_are_counted_without_reading_any_file_back(
    spark: Any, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import DataFrameReader

    from django_delayqueue.spark.bulk import schedule_dataframe
    from django_delayqueue.spark.transforms import MessageSpec

    rows = [(f"o-{i}", 60.0) for i in range(40)] + [(None, 60.0)] * 3 + [("o-x", None)] * 2
    df = spark.createDataFrame(rows, "ref string, delay_s double")

    def no_reading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the driver read a file back")

    monkeypatch.setattr(DataFrameReader, "load", no_reading)
    spec = MessageSpec(id_column="ref", delay_column="delay_s")
    summary = schedule_dataframe(
        df, settings.DELAYQUEUE["REDIS_URL"], "dq", "storage-q", spec,
        rejects_path=str(tmp_path / "rejects"),
    )  # fmt: skip
    assert (summary.scheduled, summary.rejected) == (40, 5)
    assert summary.reasons == {"missing id": 3, "missing delay": 2}
    monkeypatch.undo()
    assert spark.read.json(str(tmp_path / "rejects")).count() == 5  # and they were written
