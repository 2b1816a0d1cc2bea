"""django_delayqueue.spark.report: figures checked against a small journal worked by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from django_delayqueue.core import QueueKeys
from django_delayqueue.embedded import RedisServerProcess

H = 1_699_999_200_000  # a whole UTC hour (2023-11-14T22:00Z)
H2 = H + 3_600_000  # the next hour

# [id, scheduled, due, delivered, finished, attempt, outcome, error], as the consumer writes.
ALPHA_BATCHES = [
    [
        ["a1", H, H + 1000, H + 1000, H + 1001, 1, "ack", ""],  # 0 ms late
        ["a2", H, H + 2000, H + 2010, H + 2011, 1, "ack", ""],  # 10
        ["a3", H, H + 3000, H + 3020, H + 3021, 1, "retry", "ValueError"],  # 20
    ],
    [
        ["a4", H, H + 4000, H + 4030, H + 4031, 1, "ack", ""],  # 30
        ["a5", H, H + 5000, H + 5040, H + 5041, 1, "garbage", "Reject"],  # 40
        ["a3", H, H + 3000, H + 60000, H + 60005, 2, "retry", "ValueError"],  # not a first try
    ],
    [["c1", H, H + 900_000, None, H + 100, 0, "cancel", ""]],  # what cancel.lua writes
    [
        ["a3", H, H + 3000, H2 + 500, H2 + 510, 3, "ack", ""],
        ["b1", H, H2 + 1000, H2 + 1100, H2 + 1101, 1, "garbage", "KeyError"],  # 100
        ["b2", H, H2 + 2000, H2 + 2300, H2 + 2301, 1, "ack", ""],  # 300
    ],
]
BETA_BATCHES = [
    [["z1", H, H + 10, H + 17, H + 18, 1, "ack", ""]],
    # An atomic queue's redelivery found already done: an ack, not an error.
    [["z1", H, H + 10, H + 4017, H + 4018, 2, "ack", "AlreadyDone"]],
]
# A queue with a flow limit: rows as the consumer writes them now, with a 9th field, the time
# a limit held the message back (limit_wait_ms), beside a row written before it was kept.
GAMMA_BATCHES = [
    [
        ["g1", H, H + 100, H + 350, H + 351, 1, "ack", "", 200],  # held 200: 50 late, not 250
        ["g2", H, H + 200, H + 210, H + 211, 1, "ack", "", 0],  # 10
        ["g4", H, H + 400, H + 9000, H + 9001, 2, "ack", "", 999],  # not a first try
    ],
    [["g3", H, H + 300, H + 330, H + 331, 1, "ack", ""]],  # an older row: no wait, 30
]


def write_journal(client: redis.Redis, queue: str, batches: list[list[list[Any]]]) -> None:
    stream = QueueKeys("dq", queue).journal
    for rows in batches:
        client.xadd(stream, {"n": len(rows), "o": json.dumps(rows)})


@pytest.fixture(scope="module")
def report(spark: Any, redis_server: RedisServerProcess, tmp_path_factory: Any) -> Any:
    """The known journal, exported and reported once for the module (Spark jobs are slow)."""
    from django_delayqueue.spark.journal import export_journal, read_journal
    from django_delayqueue.spark.output import write_report
    from django_delayqueue.spark.report import compute_report

    tmp = tmp_path_factory.mktemp("report")
    client = redis.Redis.from_url(redis_server.url)
    try:
        redis_server.flushall(client)
        write_journal(client, "alpha", ALPHA_BATCHES)
        write_journal(client, "beta", BETA_BATCHES)
        write_journal(client, "gamma", GAMMA_BATCHES)
        journal = str(tmp / "journal")
        exported = export_journal(spark, redis_server.url, "dq", journal)
        assert exported == {"alpha": 10, "beta": 2, "gamma": 4}
    finally:
        redis_server.flushall(client)
        client.close()
    return write_report(compute_report(read_journal(spark, journal)), tmp / "report")


def test_hourly_figures_equal_the_hand_computed_ones(report: Any) -> None:
    hourly = {(r["queue"], r["hour_ms"]): r for r in report.tables["hourly"]}
    first = hourly["alpha", H]
    # 7 rows: a1 a2 a4 ack; a3, a3#2 retry; a5 garbage; c1 cancel.
    assert (first["outcomes"], first["ack"], first["retry"], first["garbage"]) == (7, 3, 2, 1)
    assert (first["cancel"], first["deliveries"], first["first_deliveries"]) == (1, 6, 5)
    # First-delivery lateness 0, 10, 20, 30, 40: exact percentiles interpolate between ranks:
    # p50 = rank 2 = 20; p95 = rank 3.8 = 30 + 0.8 * 10; p99 = rank 3.96 = 30 + 0.96 * 10.
    assert first["lateness_p50_ms"] == 20
    assert first["lateness_p95_ms"] == pytest.approx(38.0)
    assert first["lateness_p99_ms"] == pytest.approx(39.6)
    assert first["lateness_max_ms"] == 40
    assert first["dead_letter_rate"] == pytest.approx(1 / 4)  # garbage / (ack + garbage)
    assert first["retry_rate"] == pytest.approx(2 / 6)
    assert first["throughput_per_s"] == pytest.approx(6 / 3600)
    assert first["hour"] == "2023-11-14T22:00:00Z"

    second = hourly["alpha", H2]
    assert (second["outcomes"], second["ack"], second["garbage"], second["retry"]) == (3, 2, 1, 0)
    # Lateness 100, 300: p50 = 200, p95 = 100 + 0.95 * 200, p99 = 100 + 0.99 * 200.
    assert second["lateness_p50_ms"] == pytest.approx(200.0)
    assert second["lateness_p95_ms"] == pytest.approx(290.0)
    assert second["lateness_p99_ms"] == pytest.approx(298.0)
    assert second["dead_letter_rate"] == pytest.approx(1 / 3)


def test_summary_attempts_and_errors_equal_the_hand_computed_ones(report: Any) -> None:
    summary = {r["queue"]: r for r in report.summary}
    alpha = summary["alpha"]
    assert (alpha["outcomes"], alpha["ack"], alpha["retry"], alpha["garbage"]) == (10, 5, 2, 2)
    # Lateness 0 10 20 30 40 100 300: p50 = rank 3 = 30; p95 = rank 5.7 = 100 + 0.7 * 200;
    # p99 = rank 5.94 = 100 + 0.94 * 200.
    assert alpha["lateness_p50_ms"] == pytest.approx(30.0)
    assert alpha["lateness_p95_ms"] == pytest.approx(240.0)
    assert alpha["lateness_p99_ms"] == pytest.approx(288.0)
    assert alpha["lateness_max_ms"] == 300
    assert alpha["dead_letter_rate"] == pytest.approx(2 / 7)
    assert alpha["throughput_per_s"] == pytest.approx(9 / (2 * 3600))
    assert alpha["top_error"] == "ValueError"
    assert summary["beta"]["lateness_p50_ms"] == 7 and summary["beta"]["top_error"] is None

    attempts = {
        (r["hour_ms"], r["attempt"]): r["deliveries"]
        for r in report.tables["attempts"]
        if r["queue"] == "alpha"
    }
    assert attempts == {(H, 1): 5, (H, 2): 1, (H2, 1): 2, (H2, 3): 1}
    errors = [
        (r["hour_ms"], r["error"], r["count"], r["rank"])
        for r in report.tables["errors"]
        if r["queue"] == "alpha"
    ]
    assert errors == [(H, "ValueError", 2, 1), (H, "Reject", 1, 2), (H2, "KeyError", 1, 1)]
    histogram = [r for r in report.tables["lateness_histogram"] if r["queue"] == "alpha"]
    assert sum(r["count"] for r in histogram) == 7


def test_time_a_flow_limit_held_a_message_is_not_lateness_and_has_its_own_figures(
    report: Any,
) -> None:
    gamma = {r["queue"]: r for r in report.summary}["gamma"]
    # First deliveries: g1 350 - 100 - 200 = 50, g2 10, g3 30 (no field: 0 held).
    assert (gamma["first_deliveries"], gamma["lateness_max_ms"]) == (3, 50)
    assert gamma["lateness_p50_ms"] == 30
    # Limit waits of the same first deliveries 0, 0, 200: p99 = rank 1.98 = 0.98 * 200.
    assert (gamma["limit_wait_p50_ms"], gamma["limit_wait_max_ms"]) == (0, 200)
    assert gamma["limit_wait_p99_ms"] == pytest.approx(196.0)
    alpha = {r["queue"]: r for r in report.summary}["alpha"]
    assert (alpha["limit_wait_max_ms"], alpha["lateness_max_ms"]) == (0, 300)  # rows of old


def test_a_journal_exported_before_the_limit_wait_column_reads_it_as_zero(
    spark: Any, tmp_path: Path
) -> None:
    from django_delayqueue.spark.journal import read_journal
    from django_delayqueue.spark.report import compute_report

    old = spark.createDataFrame(
        [("old", "1-0", H, 0, "o1", H, H + 10, H + 25, H + 26, 1, "ack", "", "2023-11-14")],
        "queue string, entry_id string, entry_ms long, entry_seq long, id string, "
        "scheduled_ms long, due_ms long, delivered_ms long, finished_ms long, attempt int, "
        "outcome string, error string, day string",
    )
    old.write.partitionBy("queue", "day").parquet(str(tmp_path / "journal"))
    journal = read_journal(spark, str(tmp_path / "journal"))
    assert journal.first()["limit_wait_ms"] is None
    (row,) = compute_report(journal).summary.collect()
    assert (row["lateness_max_ms"], row["limit_wait_max_ms"]) == (15, 0)


def test_the_report_is_written_as_parquet_csv_json_and_charts(report: Any, spark: Any) -> None:
    from django_delayqueue.spark.output import format_table

    out = Path(report.out)  # a local path here; any URI Hadoop knows works the same
    with (out / "summary.csv").open() as f:
        rows = {r["queue"]: r for r in csv.DictReader(f)}
    assert float(rows["alpha"]["lateness_p95_ms"]) == pytest.approx(240.0)
    parquet = spark.read.parquet(str(out / "parquet" / "hourly"))
    assert parquet.count() == 4  # alpha x 2 hours, beta x 1, gamma x 1
    document = json.loads((out / "summary.json").read_text())
    alpha = document["queues"]["alpha"]
    assert alpha["outcomes"] == 10
    assert alpha["charts"] == {
        "lateness": "charts/alpha-lateness.png",
        "outcomes": "charts/alpha-outcomes.png",
    }
    for queue in ("alpha", "beta", "gamma"):
        for kind in ("lateness", "outcomes"):
            png = out / "charts" / f"{queue}-{kind}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob("*.png.crc"))  # the driver's files come without checksum files
    table = format_table(report.summary)
    assert table.splitlines()[0].split()[:2] == ["queue", "outcomes"]
    assert "ValueError" in table and "28.6" in table  # alpha's dead-letter rate, in percent
