"""The Spark management commands, end to end: schedule_bulk, demo_dataset, export_journal,
queue_report (on the shared local SparkSession and the test Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from core_consumer_support import burst as run_burst
from django.core.management import CommandError, call_command

from django_delayqueue.core import Message, Queue, QueueSettings

QUEUE = "order-close"  # configured in tests/settings.py


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_schedule_bulk_schedules_a_parquet_file_once_and_writes_rejects(
    spark: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    rows = [(f"order-{i}", i, 3600.0 + i) for i in range(1, 201)] + [("order-x", 0, None)]
    data = str(tmp_path / "orders.parquet")
    spark.createDataFrame(rows, "ref string, order_id long, delay_s double").write.parquet(data)
    rejects = str(tmp_path / "rejects")
    args = ["schedule_bulk", "--input", data, "--queue", QUEUE, "--id-column", "ref"]
    args += ["--delay-column", "delay_s", "--payload-columns", "order_id", "--rejects", rejects]

    output = run(*args)
    assert "200 scheduled, 0 already present, 1 rejected (of 201 rows" in output
    assert "missing delay" in output and rejects in output
    assert Queue(redis_client, QUEUE).counts()["pending"] == 200
    (reject,) = spark.read.json(rejects).collect()
    assert (reject["ref"], reject["dq_reason"]) == ("order-x", "missing delay")

    assert "0 scheduled, 200 already present, 1 rejected" in run(*args)
    assert Queue(redis_client, QUEUE).counts()["pending"] == 200


def test_schedule_bulk_refuses_an_unknown_queue_before_starting_work(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="unknown queue"):
        run("schedule_bulk", "--input", str(tmp_path), "--queue", "nope", "--id-column", "x")


def test_demo_dataset_feeds_schedule_bulk(
    spark: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    out = tmp_path / "demo"
    assert "wrote 500 orders" in run(
        "demo_dataset", "--orders", "500", "--stores", "20", "--out", str(out)
    )
    orders = spark.read.parquet(str(out / "orders"))
    assert orders.count() == 500
    assert orders.select("order_ref").distinct().count() == 500
    assert orders.agg({"store_id": "max"}).first()[0] <= 20
    assert spark.read.parquet(str(out / "stores")).count() == 20

    output = run(
        "schedule_bulk", "--input", str(out / "orders"), "--queue", QUEUE,
        "--id-column", "order_ref", "--due-column", "close_at",
        "--payload-columns", "order_id,store_id,amount", "--rejects", str(tmp_path / "rj"),
    )  # fmt: skip
    assert "500 scheduled, 0 already present, 0 rejected" in output
    counts = Queue(redis_client, QUEUE).counts()
    assert counts["pending"] + counts["ready"] == 500


def _fail_on_request(message: Message) -> None:
    if message.payload.get("fail"):
        raise KeyError("missing")


def burst(queue: Queue) -> int:
    return run_burst([queue], _fail_on_request, idle_seconds=0.2).delivered


def test_export_journal_then_queue_report(
    spark: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = QueueSettings(backoff_base=3600, backoff_max=3600)
    q = Queue(redis_client, QUEUE, settings=settings)
    for i in range(4):
        q.schedule({"n": i, "fail": i == 3}, id=f"m{i}")
    assert burst(q) == 4

    journal = str(tmp_path / "journal")
    output = run("export_journal", "--out", journal)
    assert f"{QUEUE}: 4 journal row(s) exported" in output
    assert "activation-sms: 0 journal row(s) exported" in output  # configured, no journal
    assert f"{QUEUE}: 0 journal row(s)" in run("export_journal", "--out", journal)

    report = tmp_path / "report"
    output = run("queue_report", "--journal", journal, "--out", str(report))
    header, _, line = output.splitlines()[:3]
    assert header.split()[:6] == ["queue", "outcomes", "ack", "retry", "garbage", "cancel"]
    assert line.split()[:6] == [QUEUE, "4", "3", "1", "0", "0"]
    assert "KeyError" in line
    summary = json.loads((report / "summary.json").read_text())
    assert summary["queues"][QUEUE]["deliveries"] == 4
    assert (report / summary["queues"][QUEUE]["charts"]["lateness"]).is_file()
    assert (report / "hourly.csv").is_file() and (report / "parquet" / "hourly").is_dir()


def test_an_empty_journal_is_exported_and_reported_as_empty(
    spark: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The README's order: schedule_bulk, export_journal, queue_report before any delivery."""
    Queue(redis_client, QUEUE).schedule({"n": 1}, delay=3600)
    journal = str(tmp_path / "journal")
    assert "journal written to" in run("export_journal", "--out", journal)
    from django_delayqueue.spark.journal import read_journal

    assert read_journal(spark, journal).count() == 0
    output = run("queue_report", "--journal", journal, "--out", str(tmp_path / "report"))
    assert "the journal is empty: nothing to report" in output
    assert (tmp_path / "report" / "summary.json").is_file()


def test_queue_report_on_a_missing_journal_is_a_command_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot read the journal"):
        run("queue_report", "--journal", str(tmp_path / "nope"), "--out", str(tmp_path / "r"))


NO_PYSPARK = """
import importlib, pkgutil, sys

class NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ImportError("pyspark blocked by the test")

sys.meta_path.insert(0, NoSpark())
import django
django.setup()
import django_delayqueue
for module in pkgutil.walk_packages(django_delayqueue.__path__, "django_delayqueue."):
    if not module.name.startswith("django_delayqueue.spark"):
        importlib.import_module(module.name)
from django.core.management import CommandError, call_command
try:
    call_command("demo_dataset", "--out", "unused")
except CommandError as e:
    print("refused:", e)
"""


def test_the_app_and_its_commands_import_without_pyspark() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", NO_PYSPARK], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "refused: this command needs the spark extra" in done.stdout
