"""The driver's class-data-sharing archive: written once by a JVM that exits, mapped after.

The suite itself runs with the archive off (conftest), so these tests turn it on in child
processes with a private directory and look at what the JVM really mapped (/proc/<pid>/maps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from django_delayqueue.spark import class_archive

# Starts a session the way every command does, runs a job, reports what its JVM mapped.
_CHILD = """
import json, sys
from django_delayqueue.spark.session import get_spark
spark = get_spark("class-archive-test", master="local[1]")
assert spark.range(100).count() == 100
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
maps = open(f"/proc/{pid}/maps").read()
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
mapped = sorted({line.split()[-1] for line in maps.splitlines() if line.endswith(".jsa")})
print(json.dumps({"mapped": mapped, "options": options}))
"""


def _run_child(directory: Path, **env: str) -> dict[str, object]:
    child_env = {
        **os.environ,
        class_archive.ENV_SWITCH: "1",
        class_archive.ENV_DIRECTORY: str(directory),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=child_env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_first_command_writes_the_archive_and_the_next_one_maps_it(tmp_path: Path) -> None:
    first = _run_child(tmp_path)
    archives = sorted(p.name for p in tmp_path.iterdir())
    assert len(archives) == 1 and archives[0].endswith(".jsa"), archives  # no lock, no partial
    assert "-XX:ArchiveClassesAtExit=" in str(first["options"])
    assert not any(archives[0] in m for m in first["mapped"])  # type: ignore[union-attr]

    second = _run_child(tmp_path)
    assert "-XX:SharedArchiveFile=" in str(second["options"])
    assert any(m.endswith(archives[0]) for m in second["mapped"]), second  # type: ignore[union-attr]
    assert "log4j2.configurationFile" in str(second["options"])  # our own option is kept

    # Damaged since (a disk, a copy cut short): the JVM aborts mapping it. The command still
    # runs, without it, and the archive is set aside so that the next run writes a new one.
    final = tmp_path / archives[0]
    with final.open("r+b") as archive:
        archive.truncate(final.stat().st_size // 2)
    third = _run_child(tmp_path)
    assert not any(m.endswith(archives[0]) for m in third["mapped"])  # type: ignore[union-attr]
    assert not final.exists() and final.with_suffix(".bad").exists()


def test_switched_off_nothing_is_written_or_mapped(tmp_path: Path) -> None:
    child = _run_child(tmp_path, **{class_archive.ENV_SWITCH: "0"})
    assert "SharedArchiveFile" not in str(child["options"])
    assert "ArchiveClassesAtExit" not in str(child["options"])
    assert list(tmp_path.iterdir()) == []


def test_a_users_own_driver_java_options_are_left_alone(tmp_path: Path) -> None:
    child = _run_child(
        tmp_path, PYSPARK_SUBMIT_ARGS="--conf spark.driver.extraJavaOptions=-Dx=1 pyspark-shell"
    )
    assert "Archive" not in str(child["options"]) and "Shared" not in str(child["options"])
    assert list(tmp_path.iterdir()) == []


def test_one_writer_at_a_time_and_stale_leftovers_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(class_archive.ENV_SWITCH, "1")
    writer = class_archive.plan(tmp_path)
    assert writer is not None and writer.pending is not None and writer.lock is not None
    assert writer.lock.exists()
    assert class_archive.plan(tmp_path) is None  # a second command runs without an archive

    killed = tmp_path / "spark-0000.1.2.partial"  # what a killed writer leaves behind
    killed.write_bytes(b"half")
    old = time.time() - 2 * 3600
    for leftover in (killed, writer.lock):
        os.utime(leftover, (old, old))
    after_kill = class_archive.plan(tmp_path)
    assert not killed.exists()
    assert after_kill is not None and after_kill.pending is not None  # the lock was taken over
    class_archive.release(after_kill)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_with_whitespace_gets_no_archive(tmp_path: Path) -> None:
    spaced = tmp_path / "with space"
    assert class_archive.plan(spaced) is None  # Spark splits the JVM options on whitespace
    assert not spaced.exists()


def test_off_switch_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for value in ("0", "false", "OFF", "no"):
        monkeypatch.setenv(class_archive.ENV_SWITCH, value)
        assert class_archive.plan(tmp_path) is None
    assert list(tmp_path.iterdir()) == []
