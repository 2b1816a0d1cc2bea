"""A class-data-sharing archive for the driver's JVM: a cold command starts Spark twice as fast.

Profiling a cold ``manage.py schedule_bulk`` (issue 16) showed most of its time spent before
the first row reached Redis: starting the driver's JVM and loading Spark's classes (6.4-7.9 s
for ``getOrCreate`` on this 2-core machine, then 1.7-2.2 s to read a Parquet schema). The JVM
can dump the classes a run loaded (``-XX:ArchiveClassesAtExit``) and map them at the next start
(``-XX:SharedArchiveFile``): 3.3 s and 0.8 s. So the first Spark command on a machine writes an
archive when its JVM exits, and later ones map it.

A truncated archive crashes the JVM that maps it, so an archive is only put in place (an atomic
rename) after the JVM that wrote it exited with status 0 and ``java -version`` ran cleanly
with it. Writing one makes that first exit slower (about 20 s and 180 MB here), so only one
process writes at a time: a lock file taken with ``O_EXCL``; commands started meanwhile run
without an archive. Its name hashes the java binary (path and mtime) and Spark's jars, so an
upgraded JVM or Spark writes a new one. ``DELAYQUEUE_SPARK_CLASS_ARCHIVE=0`` turns all of this
off; ``DELAYQUEUE_SPARK_CLASS_ARCHIVE_DIR`` moves it (default ``~/.cache/django-delayqueue``).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENV_SWITCH = "DELAYQUEUE_SPARK_CLASS_ARCHIVE"
ENV_DIRECTORY = "DELAYQUEUE_SPARK_CLASS_ARCHIVE_DIR"
# The archive is a speed-up, never a reason for a warning on the user's console.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_STALE_SECONDS = 3600  # a half-written archive (or a lock) of a run that was killed
_EXIT_WAIT_SECONDS = 120


@dataclass(frozen=True)
class ArchivePlan:
    """The JVM options of this run, and where a new archive is written (None: one is mapped)."""

    java_options: str
    final: Path
    pending: Path | None = None
    lock: Path | None = None  # held while ``pending`` is written


def enabled(switch: str | None = None) -> bool:
    """Whether the switch (default: ``$DELAYQUEUE_SPARK_CLASS_ARCHIVE``, unset = on) is on."""
    value = os.environ.get(ENV_SWITCH, "1") if switch is None else switch
    return value.strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    if os.environ.get(ENV_DIRECTORY):
        return Path(os.environ[ENV_DIRECTORY])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "django-delayqueue" / "spark-class-archive"


def java_binary() -> str | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def archive_path(java: str, directory: Path | None = None) -> Path:
    """Where the archive of this JVM and these Spark jars is (or will be)."""
    return (directory or cache_dir()) / f"spark-{archive_key(java)}.jsa"


def archive_key(java: str) -> str:
    """What the archive depends on: the JVM build and the exact Spark jars."""
    import pyspark

    jars = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "jars"
    parts = [java, str(os.stat(java).st_mtime_ns), pyspark.__version__, str(jars.resolve())]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def plan(directory: Path | None = None) -> ArchivePlan | None:
    """The options that map the archive, or that write one at exit; None when off or unknown."""
    java = java_binary() if enabled() else None
    if java is None:
        return None
    directory = directory or cache_dir()
    if any(c.isspace() for c in str(directory)):
        # spark.driver.extraJavaOptions is split on whitespace: such a path would break the
        # JVM's command line (a home such as "/Users/Jo Smith"; set ENV_DIRECTORY elsewhere).
        logger.debug("no class archive: whitespace in %s", directory)
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        final = archive_path(java, directory)
        _drop_stale(directory)
    except OSError as e:
        logger.debug("no class archive: %s", e)
        return None
    if final.exists():
        # A JVM that crashes on a bad archive writes its hs_err log beside it, not in the
        # user's working directory.
        crash_log = f"-XX:ErrorFile={directory}/hs_err_pid%p.log"
        return ArchivePlan(f"-XX:SharedArchiveFile={final} {_QUIET} {crash_log}", final)
    lock = directory / f"{final.stem}.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return None  # another process is writing it: this run goes without
    pending = directory / f"{final.stem}.{os.getpid()}.{time.time_ns()}.partial"
    return ArchivePlan(f"-XX:ArchiveClassesAtExit={pending} {_QUIET}", final, pending, lock)


def finish_at_exit(spark: Any, archive: ArchivePlan) -> None:
    """When this process exits, let the JVM write its archive, check it, then put it in place."""
    if archive.pending is not None:
        atexit.register(_finish, spark, archive, java_binary())


def set_aside(archive: ArchivePlan) -> None:
    """A mapped archive the JVM could not start with: move it away, so later runs write anew."""
    try:
        os.replace(archive.final, archive.final.with_suffix(".bad"))
    except OSError as e:
        logger.debug("class archive not set aside: %s", e)


def release(archive: ArchivePlan) -> None:
    """Give up writing (the session did not start): drop the lock and any partial file."""
    for path in (archive.pending, archive.lock):
        if path is not None:
            path.unlink(missing_ok=True)


def _finish(spark: Any, archive: ArchivePlan, java: str | None) -> None:
    pending = archive.pending
    assert pending is not None
    try:
        from pyspark import SparkContext

        proc = getattr(SparkContext._gateway, "proc", None)
        spark.stop()
        if proc is None or proc.stdin is None:
            return
        proc.stdin.close()  # the gateway JVM exits on EOF and writes the archive as it goes
        status = proc.wait(timeout=_EXIT_WAIT_SECONDS)
        if status == 0 and java and pending.exists() and _maps_cleanly(java, pending):
            os.replace(pending, archive.final)
            logger.debug("class archive written: %s", archive.final)
    except Exception as e:  # a speed-up must never fail the command
        logger.debug("class archive not kept: %s", e)
    finally:
        release(archive)


def _maps_cleanly(java: str, archive: Path) -> bool:
    done = subprocess.run(
        # The very options a command maps it with: a check with other flags (such as
        # -XX:+VerifySharedSpaces) can pass an archive that the real start aborts on.
        [java, f"-XX:SharedArchiveFile={archive}", *_QUIET.split(), "-version"],
        capture_output=True,
        timeout=60,
        cwd=archive.parent,  # where a crash on a bad archive leaves its hs_err log
    )  # fmt: skip
    return done.returncode == 0


def _drop_stale(directory: Path) -> None:
    cutoff = time.time() - _STALE_SECONDS
    for leftover in [*directory.glob("*.partial"), *directory.glob("*.lock")]:
        try:
            if leftover.stat().st_mtime < cutoff:
                leftover.unlink()
        except OSError:
            pass
