"""What the transactional outbox costs a view that schedules one message per request.

``bench.djapp.outbox_view`` times a checkout view (an order row and its close-order message in
one transaction) three ways, interleaved: the insert alone, ``dq.schedule`` without the outbox,
and with it (an outbox row written in the transaction, deleted after the send). On SQLite, and
on the local PostgreSQL when one answers on 127.0.0.1:5432 (the bench creates and drops its
database). The figure is the median over rounds of microseconds per request.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .harness import Bench, Child, Row
from .sizes import Sizes


@contextmanager
def _postgres() -> Iterator[dict[str, str] | None]:
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
    name = f"dq_bench_outbox_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"BENCH_PG_NAME": name}
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def outbox_cost(bench: Bench, sizes: Sizes) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp, _postgres() as pg:
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
            out, _ = Child(
                ["-m", "bench.djapp.outbox_view", str(sizes.outbox_requests), str(sizes.rounds)],
                env,
            ).wait(sizes.timeout)
            modes = json.loads(out.strip().splitlines()[-1])["modes"]
            bench.flush()
            rows += _rows(name, modes, sizes)
    return rows


def _rows(database: str, modes: dict[str, list[float]], sizes: Sizes) -> list[Row]:
    insert = statistics.median(modes["insert only"])
    without = statistics.median(modes["without outbox"])
    with_outbox = statistics.median(modes["with outbox"])
    ratios = [w / o for w, o in zip(modes["with outbox"], modes["without outbox"], strict=True)]
    what = f"checkout view on {database}, {sizes.outbox_requests:,} requests x {sizes.rounds}"
    return [
        Row(
            f"outbox.{database}.without",
            f"{what}: order row + dq.schedule, OUTBOX=False",
            without,
            "us/req",
            baseline=insert,
            baseline_what="the order row alone",
            ratio=without / insert,
            target="reported",
        ),
        Row(
            f"outbox.{database}.with",
            f"{what}: order row + dq.schedule, OUTBOX=True",
            with_outbox,
            "us/req",
            baseline=without,
            baseline_what="OUTBOX=False",
            ratio=statistics.median(ratios),
            target="reported",
            note=f"the outbox adds {with_outbox - without:.0f} us per request",
        ),
    ]
