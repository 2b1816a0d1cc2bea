"""The window an atomic queue closes, with real processes: a ``runqueue`` whose handler's
transaction has committed is killed (``kill -9``) before it acknowledges the message; the
message comes back, and its redelivery is acknowledged as already done without running the
handler again. Its effect is in the database once. On SQLite (a file shared by the processes)
and on the PostgreSQL of this machine (a database the test creates and drops).

Without the atomic mode (before it existed, or with ``"atomic"`` unknown) the redelivery runs
the handler again and the effect is there twice: what ``test_...`` below fails on.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill import Runqueues, producer
from paths import child_pythonpath
from postgres_databases import database_env

from django_delayqueue.core import QueueKeys
from django_delayqueue.embedded import RedisServerProcess

QUEUE = "drill-atomic"
NEXT = "drill-next"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    yield from database_env(request, "dq_inbox_drill")


def _migrate(env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "django", "migrate", "--noinput", "-v0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"migrate failed:\n{done.stdout}\n{done.stderr[-4000:]}"


def _query(database: dict[str, str], tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on the drill's database (the SQLite file, or the PostgreSQL one)."""
    name = database.get("DRILL_PG_NAME")
    if name is None:
        with sqlite3.connect(tmp_path / "drill.sqlite3") as db:
            return list(db.execute(sql))
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={name}") as db:
        return list(db.execute(sql))


@pytest.mark.slow
def test_a_consumer_killed_between_commit_and_ack_does_not_run_the_handler_again(
    tmp_path: Path, database: dict[str, str]
) -> None:
    server = RedisServerProcess().start()
    marks = tmp_path / "marks"
    drill_env = {
        **database,
        "DRILL_ATOMIC": json.dumps([QUEUE]),
        "DRILL_QUEUES": json.dumps({QUEUE: {"visibility_timeout": 2}, NEXT: {}}),
        "DRILL_MARKS": str(marks),
    }
    runqueues = Runqueues(server.url, tmp_path, env=drill_env)
    try:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "drill_settings",
            "PYTHONPATH": child_pythonpath(),
            "REDIS_URL": server.url,
            "DRILL_LEDGER": str(runqueues.ledger),
            "DRILL_DB": str(tmp_path / "drill.sqlite3"),
            **drill_env,
        }
        _migrate(env)
        queue = producer(server.url, QUEUE)
        queue.schedule({"do": ["commit-then-block", "ok"], "next": NEXT}, id="order-1")
        first = runqueues.start(queues=[QUEUE, NEXT])
        line = runqueues.wait(
            lambda: marks.exists() and marks.read_text().strip(),
            timeout=60,
            what="the handler's transaction committed",
        )
        _, message_id, pid = line.split()
        assert message_id == "order-1"
        # Committed, not acknowledged: the consumer dies in the window.
        keys = QueueKeys("dq", QUEUE)
        assert queue.client.zscore(keys.unack, "order-1") is not None
        os.kill(int(pid), signal.SIGKILL)
        if int(pid) == first.pid:  # no supervisor to replace it: another runqueue
            first.wait(30)
            runqueues.start(queues=[QUEUE, NEXT])
        runqueues.wait(
            lambda: queue.client.hget(keys.messages, "order-1") is None,
            timeout=60,
            what="the redelivery acknowledged",
        )
        effects = _query(
            database, tmp_path, "SELECT message_id, attempt FROM drill_app_effect ORDER BY id"
        )
        assert effects == [("order-1", 1)], effects  # once: the redelivery did not run it
        inbox = _query(
            database, tmp_path, "SELECT queue, message_id FROM django_delayqueue_inboxentry"
        )
        assert inbox == [(QUEUE, "order-1")]
        # The follow-up scheduled in the committed transaction exists, once.
        assert queue.client.hget(QueueKeys("dq", NEXT).messages, "next-order-1") is not None
        assert "order-1 already done" in runqueues.logs(), runqueues.logs()[-3000:]
        journal = [
            row
            for _, fields in queue.client.xrange(keys.journal)
            for row in json.loads(fields[b"o"])
        ]
        assert [(r[0], r[6], r[7]) for r in journal] == [("order-1", "ack", "AlreadyDone")]
    finally:
        runqueues.close()
        server.stop()
