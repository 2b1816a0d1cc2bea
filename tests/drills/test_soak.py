"""The CI-size soak: 20,000 messages through ``bench/soak.py`` with handler failures,
consumers killed and Redis restarted while they flow. Nothing lost, nothing early, and
every duplicate explained by the chaos that caused it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_soak_20k_messages_with_chaos(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "bench.soak", "--messages", "20000", "--rate", "2000"]
    cmd += ["--kill-every", "2", "--redis-every", "4", "--timeout", "90"]
    cmd += ["--json", str(report_path), "--workdir", str(tmp_path / "work")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report_path.exists(), done.stdout + done.stderr
    r = json.loads(report_path.read_text())
    summary = done.stdout[-3000:]
    assert r["scheduled"] == 20000 and r["distinct_delivered"] == 20000, summary
    assert r["lost"] == 0 and r["unknown"] == 0, summary
    assert r["early"] == 0, summary
    assert r["unexplained_duplicates"] == 0, r["examples"]
    assert done.returncode == 0, summary
    # The chaos really happened, and its duplicates were recognised as such.
    chaos = r["chaos"]
    assert chaos["consumer_kills"] >= 2 and chaos["redis_kill_9"] >= 1, chaos
    assert r["duplicates_by_cause"].get("handler raised (retry)", 0) > 0
    assert r["delivered"] == 20000 + r["duplicates"]
