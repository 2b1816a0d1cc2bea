"""supervisor/fresh.py: the command line that starts a child in a fresh interpreter after
SIGHUP, and what that child reads from its environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from django_delayqueue.supervisor.child import ChildSpec, SupervisedWorker
from django_delayqueue.supervisor.fresh import (
    CHILD_ENV,
    RestartCommand,
    child_environment,
    logical_cwd,
    restart_command,
    take_child_invocation,
)

PY = "/srv/app/venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "orig_argv"),
    [
        # python manage.py runqueue ...
        (["manage.py", "runqueue", "-p", "2"], ["python3", "manage.py", "runqueue", "-p", "2"]),
        # django-admin runqueue --settings=... (the kernel runs the script's interpreter)
        (
            ["/srv/app/venv/bin/django-admin", "runqueue", "--settings=shop.settings", "orders"],
            [
                PY,
                "/srv/app/venv/bin/django-admin",
                "runqueue",
                "--settings=shop.settings",
                "orders",
            ],
        ),
        # python -X dev -m django runqueue ... (argv[0] is django/__main__.py)
        (
            ["/srv/app/venv/lib/django/__main__.py", "runqueue", "--processes", "4"],
            [PY, "-X", "dev", "-m", "django", "runqueue", "--processes", "4"],
        ),
        # python -c "...execute_from_command_line()" runqueue
        (["-c", "runqueue"], [PY, "-c", "import x; x.main()", "runqueue"]),
    ],
)
def test_a_runqueue_started_from_its_command_line_runs_that_line_again(
    argv: list[str], orig_argv: list[str]
) -> None:
    restart = restart_command(argv, argv, orig_argv, cwd="/srv/app/current")
    assert restart == RestartCommand(tuple(orig_argv), "/srv/app/current")


@pytest.mark.parametrize(
    ("command_argv", "argv", "orig_argv"),
    [
        # call_command("runqueue") from a script: no command line of its own
        (None, ["deploy.py"], [PY, "deploy.py"]),
        # execute_from_command_line(["manage.py", "runqueue"]) from a script run otherwise
        (["manage.py", "runqueue"], ["worker.py", "--fast"], [PY, "worker.py", "--fast"]),
        # sys.argv changed by the script: the interpreter's line does not end with it
        (["manage.py", "runqueue"], ["manage.py", "runqueue"], [PY, "boot.py", "serve"]),
        (["manage.py"], ["manage.py"], [PY, "manage.py"]),
    ],
)
def test_no_command_line_to_run_again_means_none(
    command_argv: list[str] | None, argv: list[str], orig_argv: list[str]
) -> None:
    assert restart_command(command_argv, argv, orig_argv, cwd="/") is None


def test_the_directory_keeps_its_symbolic_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy that points ``current`` at a new release: a fresh child starts in the new one."""
    release = tmp_path / "release-1"
    release.mkdir()
    (tmp_path / "current").symlink_to(release)
    monkeypatch.chdir(tmp_path / "current")
    monkeypatch.setenv("PWD", str(tmp_path / "current"))
    assert logical_cwd() == str(tmp_path / "current")
    monkeypatch.setenv("PWD", str(tmp_path))  # stale: another directory
    assert logical_cwd() == os.getcwd() == str(release)
    monkeypatch.delenv("PWD")
    assert logical_cwd() == str(release)


class ShopWorker(SupervisedWorker):
    pass


def test_the_child_reads_its_spec_and_pipe_and_removes_them() -> None:
    spec = ChildSpec(
        queues=["orders", "mail"],
        name="ignored",
        slot=2,
        supervisor_name="runqueue-host-10",
        supervisor_pid=10,
        concurrency=None,
        grace_seconds=12.5,
        max_messages=1000,
        max_memory_mb=256.0,
        worker_class=ShopWorker,
    )
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, True)  # as pass_fds leaves it in the child
    try:
        env = child_environment(spec, write_fd, {"PATH": "/bin", "DJANGO_SETTINGS_MODULE": "s"})
        assert env["PATH"] == "/bin" and env["DJANGO_SETTINGS_MODULE"] == "s"
        assert json.loads(env[CHILD_ENV])["fd"] == write_fd
        invocation = take_child_invocation(env)
        assert invocation is not None
        got, fd = invocation
        assert CHILD_ENV not in env  # a process a handler starts is not a supervised child
        assert fd == write_fd and not os.get_inheritable(fd)
        assert got.name == f"runqueue-host-10.2-{os.getpid()}"
        assert got == ChildSpec(**{**spec.__dict__, "name": got.name})
        assert got.worker_class is ShopWorker
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert take_child_invocation({"PATH": "/bin"}) is None


def test_a_spec_from_another_release_still_starts_the_child() -> None:
    """A supervisor of a later release (a deploy rolled back after SIGHUP) may send a field
    this code does not know, or leave out one that has a default: the child starts all the
    same, instead of failing at every start."""
    spec = ChildSpec(
        queues=None,
        name="ignored",
        slot=1,
        supervisor_name="runqueue-host-11",
        supervisor_pid=11,
        concurrency=2,
        grace_seconds=5.0,
        max_messages=None,
        max_memory_mb=None,
        worker_class=ShopWorker,
    )
    read_fd, write_fd = os.pipe()
    try:
        env = child_environment(spec, write_fd, {})
        data = json.loads(env[CHILD_ENV])
        data["spec"]["a_field_of_a_later_release"] = {"x": 1}
        data["spec"].pop("worker_id", None)  # has a default (and is not sent at it)
        env[CHILD_ENV] = json.dumps(data)
        invocation = take_child_invocation(env)
        assert invocation is not None
        got, fd = invocation
        assert fd == write_fd and got.concurrency == 2 and got.worker_id is None
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_fields_at_their_default_are_not_sent_so_an_earlier_release_can_read_the_spec() -> None:
    """The supervisor runs this release; the code on disk was rolled back to one whose
    ChildSpec has only the fields without defaults (and worker_class): what it is sent must
    not hold a field it would refuse."""
    from dataclasses import MISSING
    from dataclasses import fields as dataclass_fields

    spec = ChildSpec(
        queues=None,
        name="ignored",
        slot=1,
        supervisor_name="runqueue-host-12",
        supervisor_pid=12,
        concurrency=None,
        grace_seconds=30.0,
        max_messages=None,
        max_memory_mb=None,
    )
    sent = set(json.loads(child_environment(spec, 5, {})[CHILD_ENV])["spec"])
    required = {f.name for f in dataclass_fields(ChildSpec) if f.default is MISSING}
    assert sent == required | {"worker_class"}
