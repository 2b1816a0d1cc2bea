"""A Spark standalone master and a worker that shares nothing with the driver but storage.

The worker runs in a private mount namespace (``unshare -m``) in which the repository checkout
and the driver's temporary directories are hidden under empty tmpfs mounts, with a Python of
its own (``make spark-worker-env``: pyarrow, pandas and redis, not this project) first on its
PATH and a working directory of its own. Spark's jars stay reachable there through a bind mount
made before the checkout is hidden. What the two sides share: one directory standing in for
the input and output storage (``shared``), the Redis, and loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ci_support import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0  # seconds for the master and the worker to come up (a bound, not a check)


def worker_python() -> Path:
    """The worker's own interpreter (``make spark-worker-env`` builds it outside the checkout)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    default = Path.home() / ".cache" / "django-delayqueue" / f"spark-worker-{version}"
    venv = Path(os.environ.get("DQ_SPARK_WORKER_VENV") or default)
    return venv / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    master_url: str
    shared: Path  # the storage both sides see
    spark_home: Path
    logs: Path

    def log_tail(self) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT} s")


def _wait_for_worker(master_ui: int, process: subprocess.Popen[bytes]) -> None:
    import json
    import urllib.request

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{master_ui}/json/", timeout=2) as r:
                if json.load(r).get("aliveworkers", 0) >= 1:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("no worker registered with the master")


@contextmanager
def standalone_cluster(hidden: list[Path]) -> Iterator[Cluster]:
    """A master and one isolated worker; both stopped (by PID) however the block ends."""
    import pyspark

    python = worker_python()
    if not python.exists():
        skip_or_fail(
            f"no Spark worker environment at {python.parent.parent}: make spark-worker-env"
        )
    if shutil.which("unshare") is None or os.geteuid() != 0:
        skip_or_fail("a private mount namespace needs unshare and root")
    spark_home = Path(pyspark.__file__).resolve().parent
    base = Path(tempfile.mkdtemp(prefix="dq-cluster-", dir="/tmp"))
    shared, logs, worker_dir = base / "shared", base / "logs", base / "worker"
    for d in (shared, logs, worker_dir / "spark-home", worker_dir / "work"):
        d.mkdir(parents=True)
    port, ui, worker_port, worker_ui = free_port(), free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK", "PYTHON"))}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master = subprocess.Popen(
            [str(spark_home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
            env={**env, "SPARK_HOME": str(spark_home)},
            stdout=(logs / "master.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        processes.append(master)
        _wait_for_port(port, master, "the Spark master")
        bind = worker_dir / "spark-home"
        hide = " && ".join(f"mount -t tmpfs tmpfs {p}" for p in hidden)
        script = (
            f"mount --bind {spark_home} {bind} && {hide} && cd {worker_dir} && "
            f"exec {bind}/bin/spark-class org.apache.spark.deploy.worker.Worker "
            f"--host 127.0.0.1 --port {worker_port} --webui-port {worker_ui} --cores 2 "
            f"--memory 1g --work-dir {worker_dir / 'work'} spark://127.0.0.1:{port}"
        )
        worker_env = {
            **env,
            "SPARK_HOME": str(bind),
            # The executors' "python3" is the worker's own (the driver names none on a cluster).
            "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(worker_dir),
        }
        worker = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            env=worker_env,
            stdout=(logs / "worker.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        processes.append(worker)
        _wait_for_worker(ui, worker)
        yield Cluster(f"spark://127.0.0.1:{port}", shared, spark_home, logs)
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)
