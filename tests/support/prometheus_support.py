"""A real Prometheus (Debian's ``prometheus`` package: /usr/bin/prometheus) for a test: started
on a free port with a configuration of the test's own, in a temporary folder, stopped at its
end; its HTTP API read with the standard library."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ci_support import skip_or_fail
from waiting import wait_until

from django_delayqueue.embedded import free_port

START_TIMEOUT = 60.0  # bound on Prometheus' start (it replays an empty TSDB: a second or two)


def prometheus_binary() -> str:
    """The ``prometheus`` command: a skip where it is missing, a failure under ``CI=true``."""
    found = shutil.which("prometheus")
    if found is None:
        skip_or_fail("prometheus not found (Debian: apt-get install prometheus)")
    return found


class Prometheus:
    """One Prometheus process serving its API on ``url``."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of ``GET /api/v1/<path>?params``; AssertionError with Prometheus' error
        when it answers anything but success."""
        query = urllib.parse.urlencode(params)
        request = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:  # 400/422: a query Prometheus refuses
            body = json.load(e)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The vector an instant query of ``expr`` returns now (a scalar: a one-item list)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def values(self, expr: str, label: str) -> dict[str, float]:
        """An instant query's values by the value of ``label``."""
        return {s["metric"].get(label, ""): float(s["value"][1]) for s in self.query(expr)}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextmanager
def running_prometheus(folder: Path, config: dict[str, Any]) -> Iterator[Prometheus]:
    """Prometheus on a free port of 127.0.0.1 with ``config`` (written as prometheus.yml in
    ``folder``, its data in ``folder``/data), ready to answer; terminated at the end."""
    binary = prometheus_binary()
    # JSON is YAML: the app's test environments have no YAML library.
    (folder / "prometheus.yml").write_text(json.dumps(config, indent=2))
    address = f"127.0.0.1:{free_port()}"
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={address}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://{address}", process, log)
    try:
        wait_until(
            lambda: process.poll() is not None or _ready(server.url),
            timeout=START_TIMEOUT,
            what=f"Prometheus ready on {address}",
            every=0.1,
            details=server.log_text,
        )
        assert process.poll() is None, f"Prometheus exited:\n{server.log_text()}"
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:  # not listening yet, or 503 while it starts
        return False
