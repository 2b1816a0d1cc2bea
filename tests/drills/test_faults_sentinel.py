"""Sentinel failover with real processes: a primary, a replica and three sentinels of our own,
a producer scheduling through the app's settings (``DELAYQUEUE['SENTINEL']``) and
``runqueue --processes 2`` delivering, while the primary is killed with ``kill -9``. The
sentinels promote the replica; producer and consumer processes follow it by themselves. The
old primary then comes back and the sentinels make it a replica of the new one.

The producer schedules as a view does, in transactions with the outbox: a send that fails in the
failover (Redis down, or not confirmed by a replica) is relayed later under its row's token.
With ``MIN_REPLICAS=1`` no schedule that returned is lost. With 0 the test reports how many were
(``DQ_SENTINEL_REPORT``: a file to append the figure to, for the README); it asserts only what
holds either way. Every redelivery must be explained by the outage (the ledger).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from drill import Runqueues
from ledger import Causes, check, read
from paths import PROGRAMS, child_pythonpath
from sentinel_support import SentinelGroup
from waiting import wait_until

PRODUCER = PROGRAMS / "sentinel_producer.py"
MESSAGES = 150
INTERVAL = 0.02  # seconds between a producer's schedules: ~3 s of producing
KILL_AFTER = 50  # schedules returned before the primary is killed


def _returned(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["id"]: row["due_ms"] for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("min_replicas", [1, 0])
def test_a_failover_loses_no_schedule_that_returned(tmp_path: Path, min_replicas: int) -> None:
    group = SentinelGroup().start()
    env = {
        "DRILL_SENTINEL": json.dumps({"hosts": group.hosts, "service_name": "mymaster"}),
        "DRILL_MIN_REPLICAS": str(min_replicas),
        "DRILL_VISIBILITY": "5",
    }
    runqueues = Runqueues(group.primary.url, tmp_path, env=env)
    producer = None
    try:
        migrate_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "drill_settings",
            "PYTHONPATH": child_pythonpath(),
            "REDIS_URL": group.primary.url,
            "DRILL_LEDGER": str(runqueues.ledger),
            "DRILL_DB": str(tmp_path / "drill.sqlite3"),
            **env,
        }
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v0"],
            env=migrate_env,
            check=True,
            timeout=120,
        )
        # As users run it: a supervisor and two consumer processes, each with connections of
        # its own to the primary the sentinels name (followed across the failover).
        consumer = runqueues.start("--processes", "2")
        runqueues.consuming_children(consumer, 2)
        out = tmp_path / "returned.jsonl"
        producer_env = migrate_env
        log = open(tmp_path / "producer.log", "wb")  # noqa: SIM115
        producer = subprocess.Popen(
            [sys.executable, str(PRODUCER), str(out), str(MESSAGES), str(INTERVAL)],
            env=producer_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until(lambda: len(_returned(out)) >= KILL_AFTER, 60, "schedules before the kill")
        old_port = group.primary.port
        outage_start = int(time.time() * 1000)
        group.primary.kill()  # kill -9
        wait_until(
            lambda: group.master_port() not in (None, old_port), 60, "the sentinels to promote"
        )
        # The old primary returns (empty: no persistence) and is made a replica of the new one.
        group.primary.restart()
        assert producer.wait(120) == 0, (tmp_path / "producer.log").read_text()[-3000:]
        outage_end = int(time.time() * 1000)
        returned = _returned(out)
        assert len(returned) == MESSAGES

        def delivered() -> set[str]:
            return {d.id for d in read(runqueues.ledger)}

        if min_replicas:
            runqueues.wait(lambda: delivered() >= set(returned), 60, "every message delivered")
        else:  # some may be lost: wait for the last ones, then what is missing is lost
            last = [f"s{i}" for i in range(MESSAGES - 5, MESSAGES)]
            runqueues.wait(lambda: delivered() >= set(last), 60, "the last messages delivered")
        causes = Causes(outages=[(outage_start, outage_end)], outage_margin_ms=5000)
        report = check(returned, read(runqueues.ledger), causes)
        assert report.unknown == [] and report.early == [], report.summary()
        assert report.unexplained == [], report.summary()
        if min_replicas:
            assert report.lost == [], report.summary()
        figure = (
            f"MIN_REPLICAS={min_replicas}: {len(report.lost)} of {len(returned)} returned "
            f"schedules lost in a kill -9 failover; redeliveries {dict(report.duplicates)}"
        )
        print(figure)
        if os.environ.get("DQ_SENTINEL_REPORT"):
            with open(os.environ["DQ_SENTINEL_REPORT"], "a") as f:
                f.write(figure + "\n")
        consumer_log = runqueues.logs()
        assert "Traceback" not in consumer_log, consumer_log[-3000:]
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        runqueues.close()
        group.stop()
