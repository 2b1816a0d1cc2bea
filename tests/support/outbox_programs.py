"""Run a program of tests/support/programs against the drill settings (its own SQLite file or
the PostgreSQL database of ``database_env``) and read what it saw: the last line of its output,
JSON. The outbox's rolling-deploy and flow-key tests start their programs this way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from paths import PROGRAMS, child_pythonpath


def run_program(name: str, tmp_path: Path, redis_url: str, database: dict[str, str]) -> Any:
    """``programs/<name>`` in a child process; fails the test when it fails."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "drill_settings",
        "PYTHONPATH": child_pythonpath(),
        "REDIS_URL": redis_url,
        "DRILL_DB": str(tmp_path / "program.sqlite3"),
        "DRILL_LEDGER": str(tmp_path / "ledger"),
        **database,
    }
    program = [sys.executable, str(PROGRAMS / name)]
    done = subprocess.run(program, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
