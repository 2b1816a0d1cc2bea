"""A deploy under ``runqueue --processes N``: new code on disk, then ``SIGHUP``.

The handler of queue "hup" lives in a module the test writes (``hup_app/handlers.py``) and
rewrites: it records each delivery in the ledger with the version of its code (the ``action``
of its end line). After SIGHUP the supervisor replaces its children one by one with fresh
interpreters that run the code on disk, each old child stopping only once its successor
consumes; the supervisor stays the same process. Real ``runqueue`` processes, real Redis.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis
from drill import Runqueues, producer, settled
from ledger import check, read, read_runs
from paths import PROGRAMS, ROOT, child_pythonpath

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow

HANDLERS = """\
import os
import socket

from django.dispatch import receiver
from ledger import OK, SLOW, Ledger

from django_delayqueue.api import topic

VERSION = "{version}"
_ledger = Ledger(os.environ["DRILL_LEDGER"])


@receiver(topic("hup"))
def on_hup(sender, message, **kwargs):
    blocks = message.payload == {{"do": "block"}} and message.attempt == 1
    started = _ledger.record(message.id, message.due_ms, message.attempt, SLOW if blocks else OK)
    if blocks:
        reader, _writer = socket.socketpair()
        reader.recv(1)  # no timeout, nothing ever written: what a time limit must stop
    _ledger.finish(
        message.id, message.queue, message.attempt, started, message.due_ms, VERSION, "ack"
    )
"""
APPS = """\
from django.apps import AppConfig


class HupConfig(AppConfig):
    name = "hup_app"

    def ready(self):
        from . import handlers  # noqa: F401
"""
SETTINGS = """\
import json
import os

from drill_settings import *  # noqa: F403
from drill_settings import DELAYQUEUE, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "hup_app"]
# Queue "hup" is hup_app's alone: one of $DRILL_QUEUES would get drill_app's receiver too.
DELAYQUEUE["QUEUES"]["hup"] = {
    **DELAYQUEUE["QUEUES"]["drill"],
    **json.loads(os.environ["HUP_QUEUE"]),
}
"""
HUP_QUEUE = {"visibility_timeout": 30, "concurrency": 2, "claim_batch": 2}


def _deploy(code: Path, version: str) -> None:
    """What a deploy does: the new handler module on disk."""
    (code / "hup_app").mkdir(parents=True, exist_ok=True)
    (code / "hup_app" / "__init__.py").write_text("")
    (code / "hup_app" / "apps.py").write_text(APPS)
    (code / "hup_app" / "handlers.py").write_text(HANDLERS.format(version=version))
    (code / "hup_settings.py").write_text(SETTINGS)


@pytest.fixture
def runqueues(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> Iterator[Runqueues]:
    code = tmp_path / "code"
    _deploy(code, "v1")
    env = {
        "DJANGO_SETTINGS_MODULE": "hup_settings",
        "PYTHONPATH": child_pythonpath(code),
        # The same size, maybe the same second: no stale .pyc can stand for the new source.
        "PYTHONDONTWRITEBYTECODE": "1",
        "HUP_QUEUE": json.dumps(HUP_QUEUE),
    }
    group = Runqueues(redis_server.url, tmp_path, env)
    yield group
    group.close()


def _versions(runqueues: Runqueues) -> dict[str, str]:
    """Message id -> the version of the code that handled it."""
    return {r.id: r.action for r in read_runs(runqueues.ledger)}


def _replaced(runqueues: Runqueues, sup: subprocess.Popen[bytes], old: set[int]) -> set[int]:
    """Wait until every child of ``sup`` is a fresh one that consumes; return them."""

    def fresh() -> set[int] | None:
        now = runqueues.children(sup)
        log = runqueues.log(sup)
        new = {pid for pid in now if f"-{pid} consuming " in log}
        return new if len(new) == len(old) and not new & old and now == new else None

    found: set[int] = runqueues.wait(fresh, 120, "every child replaced")
    return found


def _stop(runqueues: Runqueues, sup: subprocess.Popen[bytes]) -> int:
    sup.send_signal(signal.SIGTERM)
    try:
        return sup.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError("runqueue ignored SIGTERM:\n" + runqueues.logs()[-4000:]) from None


def test_sighup_after_a_deploy_runs_the_new_code_without_a_gap(
    runqueues: Runqueues, redis_server: RedisServerProcess, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "hup")
    sup = runqueues.start("--processes", "2", queues=["hup"])
    old = runqueues.consuming_children(sup, 2)
    before = [q.schedule({"n": 0}).id]
    runqueues.wait(lambda: _versions(runqueues).get(before[0]) == "v1", 60, "v1 serving")
    # A stream due across the replacement: served by v1 until v2 consumes, never unserved.
    stream = {r.id: r.due_ms for r in (q.schedule({"n": i}, delay=0.03 * i) for i in range(300))}
    _deploy(tmp_path / "code", "v2")
    sup.send_signal(signal.SIGHUP)
    new = _replaced(runqueues, sup, old)
    after = [q.schedule({"n": i}, delay=0.2).id for i in range(20)]
    runqueues.wait(lambda: settled(q), 120, "every message delivered")

    # A crash after another deploy: its replacement is a fresh interpreter too, of the code on
    # disk now; the other child goes on with the code it loaded.
    _deploy(tmp_path / "code", "v3")
    victim, survivor = sorted(new)
    os.kill(victim, signal.SIGKILL)
    runqueues.wait(lambda: "died (signal SIGKILL)" in runqueues.log(sup), 60, "the crash seen")
    (third,) = runqueues.consuming_children(sup, 2) - {survivor}
    late = [q.schedule({"n": i}).id for i in range(20)]
    runqueues.wait(lambda: settled(q), 120, "every late message delivered")
    assert sup.poll() is None  # the supervisor is the same process throughout
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-4000:]

    deliveries = read(runqueues.ledger)
    versions = _versions(runqueues)
    pids = {d.id: d.pid for d in deliveries}
    # (a) what was scheduled once the children were replaced ran the new code, in them.
    assert {versions[i] for i in after} == {"v2"}, runqueues.logs()[-3000:]
    assert {pids[i] for i in after} <= new
    # Each delivery ran the code its process loaded: v1 in the first children, v2 in those
    # SIGHUP started, v3 in the one that replaced the crashed child.
    loaded = {**dict.fromkeys(old, "v1"), **dict.fromkeys(new, "v2"), third: "v3"}
    assert all(loaded[pids[i]] == v for i, v in versions.items()), versions
    assert {versions[i] for i in late} <= {"v2", "v3"}
    # (b) no gap: the stream due during the replacement was delivered, none lost, none early,
    # none twice; and each old child was told to stop only once its successor consumed.
    scheduled = {**stream, **dict.fromkeys(before + after + late, 0)}
    report = check(scheduled, deliveries)
    assert report.ok and not report.duplicates, report.summary()
    log = runqueues.log(sup)
    stops = [line for line in log.splitlines() if "consumes: stopping" in line]
    assert {int(line.rsplit(" ", 1)[1]) for line in stops} == old, stops
    for line in stops:
        successor = line.split("consumer process ")[1].split()[0]
        assert f"-{successor} consuming " in log.split(line)[0]
    # (c) the same supervisor (the parent of every handler) exited 0 on SIGTERM.
    assert {d.ppid for d in deliveries} == {sup.pid}
    assert log.count("a fresh interpreter") == 3


def _launchers(settings: str) -> dict[str, Sequence[str]]:
    return {
        "manage.py": [sys.executable, str(ROOT / "manage.py"), "runqueue"],
        "django-admin": [
            str(Path(sys.executable).parent / "django-admin"),
            "runqueue",
            f"--settings={settings}",
        ],
    }


@pytest.mark.parametrize("launcher", ["manage.py", "django-admin"])
def test_sighup_runs_the_new_code_however_runqueue_was_started(
    launcher: str, runqueues: Runqueues, redis_server: RedisServerProcess, tmp_path: Path
) -> None:
    if launcher == "django-admin":  # the settings named by --settings alone
        runqueues.env["DJANGO_SETTINGS_MODULE"] = "drill_settings"
    q = producer(redis_server.url, "hup")
    sup = runqueues.start(queues=["hup"], command=_launchers("hup_settings")[launcher])
    old = runqueues.consuming_children(sup, 1)
    _deploy(tmp_path / "code", "v2")
    sup.send_signal(signal.SIGHUP)
    new = _replaced(runqueues, sup, old)
    ids = [q.schedule({"n": i}).id for i in range(5)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-4000:]
    versions = _versions(runqueues)
    assert [versions[i] for i in ids] == ["v2"] * 5
    assert {d.pid for d in read(runqueues.ledger)} <= new
    assert "a fresh interpreter" in runqueues.log(sup)


def test_sighup_under_call_command_forks_the_loaded_code_and_says_so(
    runqueues: Runqueues, redis_server: RedisServerProcess, tmp_path: Path
) -> None:
    """A script that runs ``call_command("runqueue")``: its command line does not run
    runqueue, so SIGHUP replaces the children by forking (the code loaded at start), with a
    warning; the replacement is still without a gap."""
    q = producer(redis_server.url, "hup")
    sup = runqueues.start(queues=["hup"], program=PROGRAMS / "call_runqueue.py")
    old = runqueues.consuming_children(sup, 1)
    _deploy(tmp_path / "code", "v2")
    sup.send_signal(signal.SIGHUP)
    _replaced(runqueues, sup, old)
    ids = [q.schedule({"n": i}).id for i in range(5)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-4000:]
    assert {_versions(runqueues)[i] for i in ids} == {"v1"}
    log = runqueues.log(sup)
    assert "not started from a command line that runs it again" in log
    assert "a fresh interpreter" not in log


def test_a_deploy_that_fails_to_load_never_replaces_a_working_process(
    runqueues: Runqueues, redis_server: RedisServerProcess, tmp_path: Path
) -> None:
    """New code that cannot be imported: each would-be successor dies at its start (retried
    with backoff) while the old process keeps consuming; once the code on disk is fixed, the
    next attempt loads it and only then is the old process stopped."""
    q = producer(redis_server.url, "hup")
    sup = runqueues.start(queues=["hup"])
    (old,) = runqueues.consuming_children(sup, 1)
    handlers = tmp_path / "code" / "hup_app" / "handlers.py"
    handlers.write_text("this is not python\n")
    sup.send_signal(signal.SIGHUP)
    runqueues.wait(
        lambda: runqueues.log(sup).count(" died (exit code 1)") >= 2, 60, "two failed successors"
    )
    during = [q.schedule({"n": i}).id for i in range(5)]
    runqueues.wait(lambda: settled(q), 60, "the old process still consuming")
    assert {_versions(runqueues)[i] for i in during} == {"v1"}
    assert old in runqueues.children(sup)
    _deploy(tmp_path / "code", "v2")
    (new,) = _replaced(runqueues, sup, {old})
    after = [q.schedule({"n": i}).id for i in range(5)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-4000:]
    assert {_versions(runqueues)[i] for i in after} == {"v2"}
    report = check(during + after, read(runqueues.ledger))
    assert report.ok and not report.duplicates, report.summary()
    assert f"consumer process {new} consumes: stopping {old}" in runqueues.log(sup)


def test_a_hung_handler_is_replaced_by_a_fork_when_the_new_code_cannot_load(
    runqueues: Runqueues, redis_server: RedisServerProcess, tmp_path: Path
) -> None:
    """After a SIGHUP whose new code fails to import, a handler hung past its time limit: its
    process must be replaced, and no fresh interpreter can start. A fork of the code the
    supervisor loaded stands in (the log says so), so the hung message is retried once the old
    process is gone and the messages behind it (one handler thread) are delivered, instead of
    waiting until someone fixes the code. Once the code on disk loads, a fresh interpreter
    replaces the stand-in."""
    runqueues.env["HUP_QUEUE"] = json.dumps(
        {"visibility_timeout": 30, "concurrency": 1, "claim_batch": 1, "time_limit": 1}
    )
    q = producer(redis_server.url, "hup")
    sup = runqueues.start("--grace", "2", queues=["hup"])
    (old,) = runqueues.consuming_children(sup, 1)
    handlers = tmp_path / "code" / "hup_app" / "handlers.py"
    handlers.write_text("this is not python\n")
    sup.send_signal(signal.SIGHUP)
    runqueues.wait(
        lambda: runqueues.log(sup).count(" died (exit code 1)") >= 2, 60, "two failed successors"
    )
    hung = q.schedule({"do": "block"}).id  # blocks on its first attempt
    behind = [q.schedule({"n": i}).id for i in range(3)]
    runqueues.wait(lambda: settled(q), 90, "the hung message retried, the others delivered")
    log = runqueues.log(sup)
    assert "could not stop 1 handler(s)" in log
    assert "no fresh interpreter can start" in log and "forking one from the code" in log
    assert f"message {hung} stopped (time limit exceeded (1 s)): retried" in log
    runs = {(r.id, r.attempt): r for r in read_runs(runqueues.ledger)}
    stand_in = runs[(hung, 2)].pid
    assert stand_in != old and runs[(hung, 2)].action == "v1"  # the supervisor's code
    assert {runs[(i, 1)].action for i in behind} == {"v1"}
    assert (hung, 1) not in runs  # stopped, never ended: retried only once its process was gone
    # The code on disk is fixed: a fresh interpreter replaces the stand-in.
    _deploy(tmp_path / "code", "v2")
    _replaced(runqueues, sup, {stand_in})
    after = [q.schedule({"n": i}).id for i in range(3)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-4000:]
    assert {_versions(runqueues)[i] for i in after} == {"v2"}
    report = check([hung, *behind, *after], read(runqueues.ledger))
    assert report.ok, report.summary()
