"""Helpers shared by the fault drills: consumer subprocesses we own, and bounded waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from paths import PROGRAMS, child_pythonpath
from waiting import wait_until

from django_delayqueue.core import Queue, QueueSettings

FAULT_CONSUMER = PROGRAMS / "fault_consumer.py"


class Consumers:
    """Starts ``fault_consumer.py`` processes and makes sure every one of them ends."""

    def __init__(self, url: str, queue: str | list[str], workdir: Path, **defaults: Any) -> None:
        self.url = url
        self.queues = [queue] if isinstance(queue, str) else list(queue)
        self.workdir = workdir
        self.defaults = defaults
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **options: Any) -> subprocess.Popen[bytes]:
        opts = {**self.defaults, **options}
        cmd = [sys.executable, str(FAULT_CONSUMER), "--url", opts.pop("url", self.url)]
        for q in self.queues:
            cmd += ["--queue", q]
        for key, value in opts.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                cmd.append(flag)
            elif value is not None and value is not False:
                cmd += [flag, str(value)]
        log = open(self.workdir / f"consumer-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """:func:`waiting.wait_until`, with the consumers' logs in the failure message."""
        try:
            return wait_until(predicate, timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- consumer logs ---\n{self.logs()[-4000:]}") from None

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("consumer-*.log")))

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
        """SIGTERM (graceful) and wait; SIGKILL if it does not end in time."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"consumer {proc.pid} ignored SIGTERM for {timeout}s") from None

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # only PIDs this object started
                proc.wait()


@contextmanager
def consumers(
    url: str, queue: str | list[str], workdir: Path, **defaults: Any
) -> Iterator[Consumers]:
    group = Consumers(url, queue, workdir, **defaults)
    try:
        yield group
    finally:
        group.close()


class Runqueues:
    """``python -m django runqueue QUEUE...`` processes of the drill project (support/drill_app).

    Each one logs to ``workdir/runqueue-<n>.log``; every one still running is killed at
    :meth:`close` (only the PIDs this object started).
    """

    def __init__(
        self,
        url: str,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.url = url
        self.workdir = workdir
        self.ledger = workdir / "ledger.jsonl"
        self.env = dict(env or {})
        # Where the processes start: ``python -m`` puts it first on their path, so a drill of
        # another release's package (test_upgrade_drill) starts them outside this checkout.
        self.cwd = cwd
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        *args: str,
        queues: Sequence[str] = ("drill",),
        program: Path | None = None,
        command: Sequence[str] | None = None,
        **env: str,
    ) -> subprocess.Popen[bytes]:
        """Start one ``runqueue`` for ``queues`` (empty: every configured queue).

        ``env`` keys become ``DRILL_<KEY>`` variables (see drill_settings.py); ``program``
        runs a script that runs ``runqueue`` (programs/limited_runqueue.py) instead;
        ``command`` starts it another way than ``python -m django runqueue`` (e.g.
        ``python manage.py runqueue``), the queues and ``args`` after it.
        """
        environ = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "drill_settings",
            "PYTHONPATH": child_pythonpath(),
            "REDIS_URL": self.url,
            "DRILL_LEDGER": str(self.ledger),
            "DRILL_DB": str(self.workdir / "drill.sqlite3"),
            **self.env,
            **{f"DRILL_{k.upper()}": str(v) for k, v in env.items()},
        }
        log = open(self.workdir / f"runqueue-{len(self.procs)}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "django", "runqueue", *queues, *args]
        if program is not None:
            cmd = [sys.executable, str(program), *queues, *args]
        if command is not None:
            cmd = [*command, *queues, *args]
        proc = subprocess.Popen(
            cmd, env=environ, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd
        )
        log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("runqueue-*.log")))

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.workdir / f"runqueue-{self.procs.index(proc)}.log").read_text()

    def consuming(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` has started its loop (and so handles SIGTERM: before that, Django
        is still loading and a SIGTERM ends the process the default way, exit code -15)."""
        return " consuming " in self.log(proc)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        try:
            return wait_until(predicate, timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- runqueue logs ---\n{self.logs()[-6000:]}") from None

    @staticmethod
    def children(proc: subprocess.Popen[bytes]) -> set[int]:
        """The consumer processes ``proc`` (a supervising runqueue) has now (Linux /proc)."""
        try:
            text = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
        except OSError:
            return set()
        return {int(pid) for pid in text.split()}

    def consuming_children(self, proc: subprocess.Popen[bytes], count: int) -> set[int]:
        """Wait until ``proc`` has ``count`` children that each said "consuming"; return them."""

        def ready() -> set[int] | None:
            pids = self.children(proc)
            log = self.log(proc)
            said = {pid for pid in pids if f"-{pid} consuming " in log}
            return said if len(said) == count and said == pids else None

        found: set[int] = self.wait(ready, 60, f"{count} consumer process(es) consuming")
        return found

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def producer(url: str, name: str, prefix: str = "dq", **settings: Any) -> Queue:
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    return Queue(client, name, prefix=prefix, settings=QueueSettings(**settings))


def settled(queue: Queue) -> bool:
    """Nothing waiting or in flight (garbage may hold dead letters)."""
    counts = queue.counts()
    return all(counts[s] == 0 for s in ("pending", "ready", "unack", "retry"))
