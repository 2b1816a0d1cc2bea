"""A flow key given to ``dq.schedule`` inside a transaction, with the outbox on, is kept: in the
row's envelope (the bytes Redis stores, so no column of its own and no migration), sent right
after the commit, or by the relay once Redis is back (docs/flow-control.md, "The outbox").

A program (tests/support/programs/outbox_keyed_rows.py) migrates a fresh database and runs
both paths: on SQLite and on the PostgreSQL of this machine (a database the test creates and
drops).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from paths import PROGRAMS, child_pythonpath
from postgres_databases import database_env

from django_delayqueue.embedded import RedisServerProcess


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    yield from database_env(request, "dq_outbox_keys")


def test_a_keyed_message_keeps_its_key_through_the_commit_and_the_relay(
    tmp_path: Path,
    database: dict[str, str],
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "drill_settings",
        "PYTHONPATH": child_pythonpath(),
        "REDIS_URL": redis_server.url,
        "DRILL_DB": str(tmp_path / "keys.sqlite3"),
        "DRILL_LEDGER": str(tmp_path / "ledger"),
        **database,
    }
    program = [sys.executable, str(PROGRAMS / "outbox_keyed_rows.py")]
    done = subprocess.run(program, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["vendor"] == ("postgresql" if database else "sqlite")
    assert seen["committed_row_key"] == "+33612345678"  # in the row, inside the transaction
    assert seen["kept_row_key"] == "store-42" and seen["kept_before_relay"] is False
    assert (seen["sent"], seen["failed"], seen["rows_left"]) == (1, 0, 0)
    assert seen["stored_keys"] == {"committed": "+33612345678", "relayed": "store-42"}
    assert seen["flow_keys"] == {"committed": "+33612345678", "relayed": "store-42"}
