"""What an atomic queue (docs/exactly-once.md) costs per message, beside the same handler on a
queue that is not atomic, same run.

``bench.djapp.atomic_handler`` delivers messages whose handler inserts one row in a
transaction, with and without the mode, interleaved; the mode adds the inbox row's INSERT to a
transaction the handler needed anyway. On SQLite, and on the local PostgreSQL when one answers
on 127.0.0.1:5432 (a database created and dropped here). The figure is the median over rounds
of microseconds per delivered message.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from .harness import Bench, Child, Row
from .outbox_cost import _postgres
from .sizes import Sizes


def atomic_cost(bench: Bench, sizes: Sizes) -> list[Row]:
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
                ["-m", "bench.djapp.atomic_handler", str(sizes.atomic_messages), str(sizes.rounds)],
                env,
            ).wait(sizes.timeout)
            modes = json.loads(out.strip().splitlines()[-1])["modes"]
            bench.flush()
            rows += _rows(name, modes, sizes)
    return rows


def _rows(database: str, modes: dict[str, list[float]], sizes: Sizes) -> list[Row]:
    plain = statistics.median(modes["plain"])
    atomic = statistics.median(modes["atomic"])
    ratios = [a / p for a, p in zip(modes["atomic"], modes["plain"], strict=True)]
    return [
        Row(
            f"atomic.{database}",
            f"a handler inserting one row in a transaction on {database}, "
            f"{sizes.atomic_messages:,} messages x {sizes.rounds}: atomic queue",
            atomic,
            "us/msg",
            baseline=plain,
            baseline_what="the same handler, queue not atomic",
            ratio=statistics.median(ratios),
            target="reported",
            note=f"the inbox row adds {atomic - plain:.0f} us per message",
        )
    ]
