"""Run the demo shop: Redis, migrations, an admin user, then runserver, runqueue and the traffic.

Called by ``make demo``. Redis is ``$REDIS_URL``, else the one on 127.0.0.1:6379, else an
embedded redis-server started here and stopped on exit. ``runqueue --processes 2`` delivers
every queue; ``demo_traffic`` plays the shop's customers (``--no-traffic`` leaves it out, so
that only what you do on the pages happens). Ctrl-C (or SIGTERM) is passed on to the
children, which get time to finish what they hold before being killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is demo_project/: put the repo root first so the app imports
# even without the editable install.
sys.path.insert(0, str(ROOT))

from django_delayqueue.embedded import ensure_redis_url  # noqa: E402

MANAGE = ROOT / "manage.py"
STOP_TIMEOUT = 10.0  # seconds a child gets to shut down cleanly before SIGKILL
# Idempotent: re-running the demo resets the password instead of failing on a taken name.
CREATE_ADMIN = """
from django.contrib.auth import get_user_model
from django.db import connection
user, _ = get_user_model().objects.get_or_create(
    username="admin", defaults={"email": "admin@example.com"}
)
user.is_staff = user.is_superuser = True
user.set_password("admin")
user.save()
# runserver, the consumers and the traffic write to one SQLite file: readers do not wait for a
# writer in WAL mode (kept in the file).
if connection.vendor == "sqlite":
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=WAL")
"""


def manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, str(MANAGE), *args], cwd=ROOT, env=env, check=True)


def spawn(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # A process group of its own, so that (1) a terminal Ctrl-C reaches only us and each child
    # gets exactly one forwarded signal, and (2) killpg reaches runserver's autoreload child.
    return subprocess.Popen(
        [sys.executable, str(MANAGE), *args], cwd=ROOT, env=env, start_new_session=True
    )


def signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)  # the group we created for it, nobody else's


def stop_children(children: list[subprocess.Popen[bytes]], signum: int) -> None:
    for child in children:
        signal_group(child, signum)
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(child, signal.SIGKILL)
            child.wait()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="runserver port (default 8000)")
    parser.add_argument("--no-runserver", action="store_true", help="run no web server")
    parser.add_argument(
        "--no-traffic",
        action="store_true",
        help="start no traffic generator: only what you do on the shop's pages happens",
    )
    parser.add_argument(
        "--processes", type=int, default=2, help="consumer processes of runqueue (default 2)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    url, server = ensure_redis_url(env)
    env["REDIS_URL"] = url
    print(f"Redis: {url}" + (" (embedded, stopped on exit)" if server else ""), flush=True)
    children: list[subprocess.Popen[bytes]] = []
    try:
        manage("migrate", "--noinput", "--verbosity", "0", env=env)
        manage("shell", "--verbosity", "0", "--command", CREATE_ADMIN, env=env)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

        if not args.no_runserver:
            children.append(spawn("runserver", f"127.0.0.1:{args.port}", env=env))
            print(f"\nDemo shop: http://127.0.0.1:{args.port}/")
            print(f"Admin:     http://127.0.0.1:{args.port}/admin/  (login admin / admin)")
        children.append(spawn("runqueue", "--processes", str(args.processes), env=env))
        print(f"Consumers: runqueue --processes {args.processes}, every queue")
        if not args.no_traffic:
            children.append(spawn("demo_traffic", env=env))
            print("Traffic:   customers, an SMS gateway and a partner (--no-traffic: none)")
        print("Press Ctrl-C to stop.\n", flush=True)

        while not received and all(child.poll() is None for child in children):
            time.sleep(0.2)
        stop_children(children, received[0] if received else signal.SIGTERM)
        failed = [child.returncode for child in children if child.returncode not in (0, None)]
        return 0 if received or not failed else failed[0]
    except subprocess.CalledProcessError as exc:
        print(f"run_demo: {exc}", file=sys.stderr)
        return exc.returncode or 1
    except KeyboardInterrupt:  # Ctrl-C before the children started
        return 130
    finally:
        stop_children(children, signal.SIGTERM)  # no-op for children already gone
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
