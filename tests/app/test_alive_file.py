"""``runqueue --alive-file`` and ``python -m django_delayqueue.alive``: a worker pod's liveness
probe (issue 38: runqueue had no probe of its own). The real process: test_runqueue.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayqueue.alive import AliveFile

LONG_AGO = 1_000_000_000  # 2001: far older than any --max-age


def probe(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django_delayqueue.alive", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_probe_passes_a_fresh_file_and_fails_an_old_or_missing_one(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    alive.touch()
    assert probe(alive, "--max-age", "60").returncode == 0
    os.utime(alive, (LONG_AGO, LONG_AGO))
    old = probe(alive, "--max-age", "60")
    assert old.returncode == 1 and "last changed" in old.stderr and "--max-age 60" in old.stderr
    missing = probe(tmp_path / "nothing")
    assert missing.returncode == 1 and "cannot be read" in missing.stderr
    bad = probe(alive, "--max-age", "nan")
    assert bad.returncode == 2 and "--max-age must be a finite number" in bad.stderr


def test_the_file_is_touched_at_most_once_a_second(tmp_path: Path) -> None:
    now = [100.0]
    path = tmp_path / "alive"
    alive = AliveFile(str(path), monotonic=lambda: now[0])
    alive.touch()  # creates it
    assert path.exists()
    os.utime(path, (LONG_AGO, LONG_AGO))
    now[0] += 0.5
    alive.touch()
    assert path.stat().st_mtime == LONG_AGO  # not yet
    now[0] += 0.5
    alive.touch()
    assert path.stat().st_mtime > LONG_AGO


def test_a_file_that_cannot_be_written_is_refused_at_start(redis_client: redis.Redis) -> None:
    with pytest.raises(CommandError, match=r"--alive-file /nonexistent/dir/alive: cannot be"):
        call_command("runqueue", "--burst", "--alive-file", "/nonexistent/dir/alive")
