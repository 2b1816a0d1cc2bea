"""The Spark commands on a standalone cluster whose worker shares nothing with the driver but the
storage (one shared directory here), the Redis and the network
(tests/support/spark_cluster_support.py): its own Python without this project, its own working
directory, and no view of the checkout or of the driver's directories. Every row must be accounted
for from the driver's side."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from core_consumer_support import burst
from spark_cluster_support import ROOT, Cluster, standalone_cluster

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow
COMMAND_TIMEOUT = 300  # seconds a command may take here (a bound against hangs, not a check)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    hidden = [ROOT, tmp_path_factory.getbasetemp()]
    with standalone_cluster(hidden) as c:
        yield c


def driver_env(redis_server: RedisServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    # Loopback only: the driver must not advertise another interface to the executors.
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return {**env, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}


def manage(cluster: Cluster, redis_server: RedisServerProcess, cwd: Path, *args: str) -> str:
    command = [sys.executable, str(ROOT / "manage.py"), *args, "--master", cluster.master_url]
    done = subprocess.run(
        command, cwd=cwd, env=driver_env(redis_server), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, f"{args[0]}: {done.stderr[-3000:]}\n{cluster.log_tail()}"
    return done.stdout


def write_orders(path: Path) -> None:
    """1,000 orders: 30 without an id, 40 without a delay (70 rejects), 930 good."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["order_ref", "order_id", "delay_s"])
        for i in range(1000):
            ref = "" if i < 30 else f"order-{i}"
            delay = "" if 30 <= i < 70 else str(3600 + i)
            out.writerow([ref, i, delay])


def json_rows(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(directory.glob("part-*")) for line in f.open()]


# Several spark-submit commands on a standalone cluster, each bounded by COMMAND_TIMEOUT: the
# whole took close to the suite's 300 s on this 2-core machine beside the other CI lane (once
# over it). A bound against hangs, not a speed check.
@pytest.mark.timeout(900)
def test_every_command_on_a_cluster_that_shares_only_storage_and_redis(
    cluster: Cluster, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    shared, uri = cluster.shared, f"file://{cluster.shared}"

    out = manage(cluster, redis_server, tmp_path, "demo_dataset", "--orders", "500",
                 "--stores", "20", "--out", f"{uri}/demo")  # fmt: skip
    assert f"wrote 500 orders to {uri}/demo/orders" in out
    assert list((shared / "demo" / "orders").glob("part-*.parquet"))

    write_orders(shared / "orders.csv")
    bulk = ["schedule_bulk", "--input", f"{uri}/orders.csv", "--queue", "order-close",
            "--id-column", "order_ref", "--delay-column", "delay_s", "--no-progress",
            "--rejects", f"{uri}/rejects", "--redis-url", redis_server.url]  # fmt: skip
    out = manage(cluster, redis_server, tmp_path, *bulk)
    assert "930 scheduled, 0 already present, 70 rejected (of 1000 rows" in out
    assert "30  missing id" in out and "40  missing delay" in out
    assert len(json_rows(shared / "rejects")) == 70  # written by the executors, seen here
    assert Queue(redis_client, "order-close").counts()["pending"] == 930

    out = manage(cluster, redis_server, tmp_path, *bulk)
    assert "0 scheduled, 930 already present, 70 rejected" in out

    sms = Queue(redis_client, "activation-sms")
    for i in range(5):
        sms.schedule({"store_id": i}, id=f"s{i}")
    assert burst([sms], lambda message: None, idle_seconds=0.2).delivered == 5
    export = ["export_journal", "--out", f"{uri}/journal", "--queues", "activation-sms",
              "--redis-url", redis_server.url]  # fmt: skip
    assert "activation-sms: 5 journal row(s) exported" in manage(
        cluster, redis_server, tmp_path, *export
    )
    assert "activation-sms: 0 journal row(s) exported" in manage(
        cluster, redis_server, tmp_path, *export
    )

    out = manage(cluster, redis_server, tmp_path, "queue_report", "--journal",
                 f"{uri}/journal", "--out", f"{uri}/report")  # fmt: skip
    assert "activation-sms" in out
    report = shared / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["queues"]["activation-sms"]["outcomes"] == 5
    assert (report / "summary.csv").is_file() and list((report / "parquet" / "hourly").glob("*"))
    for kind in ("lateness", "outcomes"):
        png = report / "charts" / f"activation-sms-{kind}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_spark_submit_runs_a_job_written_by_the_command_with_no_django_on_the_driver(
    cluster: Cluster, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    shared, uri = cluster.shared, f"file://{cluster.shared}"
    write_orders(shared / "orders-2.csv")
    job = tmp_path / "job.json"
    manage(cluster, redis_server, tmp_path, "schedule_bulk", "--input", f"{uri}/orders-2.csv",
           "--queue", "activation-sms", "--id-column", "order_ref", "--delay-column", "delay_s",
           "--rejects", f"{uri}/rejects-2", "--redis-url", redis_server.url,
           "--write-job", str(job))  # fmt: skip
    package = tmp_path / "django_delayqueue.zip"
    subprocess.run([sys.executable, "-m", "django_delayqueue.spark.package", str(package)],
                   check=True, timeout=60, cwd=tmp_path)  # fmt: skip
    import django_delayqueue.spark.submit as entry

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK", "SPARK", "DJANGO", "PYTHONPATH"))}  # fmt: skip
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable  # the driver has pyspark; no Django settings
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [str(cluster.spark_home / "bin" / "spark-submit"), "--master", cluster.master_url,
         "--py-files", str(package), entry.__file__, "schedule", "--job", str(job)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{_errors(done.stderr)}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["scheduled"], result["already_present"], result["rejected"]) == (930, 0, 70)
    assert len(json_rows(shared / "rejects-2")) == 70
    assert Queue(redis_client, "activation-sms").counts()["pending"] == 930


def _errors(stderr: str) -> str:
    """The lines of a Spark driver's stderr that say what went wrong."""
    lines = stderr.splitlines()
    keep = [line for line in lines if " INFO " not in line]
    return "\n".join(keep[-80:])
