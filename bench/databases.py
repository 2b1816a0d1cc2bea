"""The databases a bench section that times Django's database work runs on: a SQLite file, and
the local PostgreSQL when one answers on 127.0.0.1:5432 (a database created and dropped here).

:func:`measure_per_database` migrates each one and runs a ``bench.djapp`` program on it that
prints its figures as JSON on its last line (``{"modes": {mode: [figure per round]}, ...}``:
bench/outbox_cost.py, bench/atomic_cost.py).
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .harness import Bench, Child
from .sizes import Sizes


@contextmanager
def postgres(prefix: str) -> Iterator[dict[str, str] | None]:
    """The environment naming a fresh database ``<prefix>_<random>`` on the local PostgreSQL
    to ``bench.djapp.settings`` (dropped afterwards); None when there is no driver or server."""
    try:
        import psycopg

        admin = psycopg.connect(
            "host=127.0.0.1 port=5432 user=postgres dbname=postgres",
            autocommit=True,
            connect_timeout=3,
        )
    except Exception:  # no driver or no server: the SQLite rows only
        yield None
        return
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"BENCH_PG_NAME": name}
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def measure_per_database(
    bench: Bench, sizes: Sizes, program: list[str], prefix: str
) -> dict[str, dict[str, Any]]:
    """What ``python -m <program...>`` printed last (JSON) on each database (``{"sqlite":
    figures, "postgresql": figures}``, the latter when PostgreSQL answers), after ``migrate``;
    Redis flushed after each."""
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp, postgres(prefix) as pg:
        databases = {"sqlite": {"BENCH_DB": str(Path(tmp) / "bench.sqlite3")}}
        if pg is not None:
            databases["postgresql"] = pg
        for name, db_env in databases.items():
            env = {
                "DJANGO_SETTINGS_MODULE": "bench.djapp.settings",
                "BENCH_REDIS_URL": bench.url,
                **db_env,
            }
            Child(["-m", "django", "migrate", "-v", "0"], env).wait(sizes.timeout)
            out, _ = Child(["-m", *program], env).wait(sizes.timeout)
            results[name] = json.loads(out.strip().splitlines()[-1])
            bench.flush()
    return results
