"""A fresh database on the local PostgreSQL for a test that runs a program against it, and the
``database`` parameters (SQLite, PostgreSQL) such tests run over. In CI PostgreSQL must be
there (a missing server or driver fails); elsewhere its case is skipped."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def postgres_database(prefix: str) -> Iterator[dict[str, str]]:
    """Create ``<prefix>_<random>``, yield the environment naming it to the program
    (``DRILL_PG_NAME``), drop it afterwards."""
    psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432: {e}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"DRILL_PG_NAME": name}
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def database_env(request: pytest.FixtureRequest, prefix: str) -> Iterator[dict[str, str]]:
    """For a fixture parametrized ``["sqlite", "postgresql"]``: the environment of its case."""
    if request.param == "sqlite":
        yield {}
    else:
        yield from postgres_database(prefix)
