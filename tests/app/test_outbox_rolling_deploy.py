"""A rolling deploy: processes not yet upgraded keep writing outbox rows without the columns
of the newer migrations (``unique_ms``, 0007). Their inserts must not fail their transaction on
any database, and the relay sends such a row as it was meant: without a uniqueness window.

A program (tests/support/programs/outbox_old_row.py) migrates a fresh database, inserts the
row with raw SQL as the old model would, and relays it: on SQLite and on the PostgreSQL of this
machine (127.0.0.1:5432, trust auth; a database the test creates and drops).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from outbox_programs import run_program
from postgres_databases import database_env

from django_delayqueue.embedded import RedisServerProcess


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    yield from database_env(request, "dq_rolling_deploy")


def test_a_row_written_without_the_window_column_is_kept_and_relayed_without_a_window(
    tmp_path: Path,
    database: dict[str, str],
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
) -> None:
    seen = run_program("outbox_old_row.py", tmp_path, redis_server.url, database)
    assert seen["vendor"] == ("postgresql" if database else "sqlite")
    assert seen["inserted"] == "inserted"  # the old process's transaction commits
    assert (seen["sent"], seen["failed"], seen["rows_left"]) == (1, 0, 0)
    assert seen["stored"] is True
    assert seen["window"] is None  # no uniqueness window opened for it
