"""The outbox drill, with real processes: Redis is down when a producer commits its orders, then
comes back, and two ``runqueue`` processes (two relays racing for the same rows) deliver them.

On SQLite (a file shared by the processes) and on the PostgreSQL of this machine
(127.0.0.1:5432, trust auth; a database the test creates and drops), where the relays claim
rows with ``SELECT ... FOR UPDATE SKIP LOCKED``. Proven from the delivery ledger: every
committed message delivered exactly once, none before its due time, nothing of a rolled-back
transaction, and the outbox empty afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from drill import Runqueues
from ledger import check, read
from paths import PROGRAMS, child_pythonpath
from postgres_databases import database_env

from django_delayqueue.embedded import RedisServerProcess

PRODUCER = PROGRAMS / "outbox_producer.py"
MESSAGES = 60


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    yield from database_env(request, "dq_outbox_drill")


def _run(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.slow
def test_messages_committed_while_redis_was_down_are_delivered_once_each(
    tmp_path: Path, database: dict[str, str]
) -> None:
    server = RedisServerProcess().start()
    runqueues = Runqueues(server.url, tmp_path, env={**database, "DRILL_RELAY_SECONDS": "0.05"})
    try:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "drill_settings",
            "PYTHONPATH": child_pythonpath(),
            "REDIS_URL": server.url,
            "DRILL_LEDGER": str(runqueues.ledger),
            "DRILL_DB": str(tmp_path / "drill.sqlite3"),
            **database,
        }
        _run([sys.executable, "-m", "django", "migrate", "--noinput", "-v0"], env)
        server.kill()  # Redis is down while the orders commit
        produced = json.loads(_run([sys.executable, str(PRODUCER), "produce", str(MESSAGES)], env))
        committed: dict[str, int] = produced["committed"]
        assert len(committed) == MESSAGES
        assert int(_run([sys.executable, str(PRODUCER), "count"], env)) == MESSAGES
        server.restart()
        # Two runqueues start together: their relays race for the same rows.
        procs = [runqueues.start(), runqueues.start()]
        runqueues.wait(
            lambda: {d.id for d in read(runqueues.ledger)} >= set(committed),
            timeout=60,
            what="every committed message delivered",
        )
        runqueues.wait(
            lambda: int(_run([sys.executable, str(PRODUCER), "count"], env)) == 0,
            timeout=30,
            what="the outbox emptied",
        )
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        deliveries = read(runqueues.ledger)
        report = check(committed, deliveries)
        assert report.lost == [] and report.unknown == [], report.summary()
        assert report.early == [], report.summary()
        assert report.delivered == MESSAGES, report.summary()  # once each: no duplicates
        assert not set(produced["rolled_back"]) & {d.id for d in deliveries}
        logs = runqueues.logs()
        assert "outbox: sent" in logs and "Traceback" not in logs, logs[-3000:]
    finally:
        runqueues.close()
        server.stop()
