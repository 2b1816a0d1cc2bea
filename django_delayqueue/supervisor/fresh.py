"""Children in a fresh interpreter: after ``SIGHUP``, the code on disk (a deploy without a gap).

A forked child runs the code its supervisor loaded at its start. After a ``SIGHUP`` the
supervisor starts every child instead by running again the command line that started it
(``sys.orig_argv``: ``python manage.py runqueue ...``, ``django-admin runqueue
--settings=...``, ``python -m django runqueue ...``), in the same directory and environment,
plus :data:`CHILD_ENV`: the spec of the child (:class:`.child.ChildSpec`, as JSON) and the file
descriptor of its end of the pipe, passed to it alone. ``runqueue`` sees the variable and runs
as that supervised child (:func:`.child.run_child`), through the same protocol as a forked one.

Only a ``runqueue`` started from a command line can be started again this way: one run by
``call_command()`` from a script whose command line does not run ``runqueue`` cannot, and its
supervisor goes on forking (:func:`restart_command` says which).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import MISSING, asdict, dataclass, replace
from dataclasses import fields as dataclass_fields

from django.utils.module_loading import import_string

from django_delayqueue.supervisor.child import ChildSpec, SupervisedWorker

CHILD_ENV = "DELAYQUEUE_SUPERVISED_CHILD"


@dataclass(frozen=True)
class RestartCommand:
    """How to run this ``runqueue`` again: its command line and its (logical) directory."""

    argv: tuple[str, ...]
    cwd: str


def restart_command(
    command_argv: Sequence[str] | None,
    argv: Sequence[str] | None = None,
    orig_argv: Sequence[str] | None = None,
    cwd: str | None = None,
) -> RestartCommand | None:
    """The command line that runs this ``runqueue`` again, or None when there is none.

    ``command_argv`` is what Django's command-line utility gave the command
    (``BaseCommand.run_from_argv``; None under ``call_command``). It must be this process's
    ``sys.argv`` (``argv``), whose arguments must end the interpreter's own command line
    (``orig_argv``: the interpreter and its options first): then running ``orig_argv`` runs the
    same command again. A script that called ``execute_from_command_line([...])`` with other
    arguments than its own fails the test.
    """
    if command_argv is None:
        return None
    argv = list(sys.argv if argv is None else argv)
    orig = list(sys.orig_argv if orig_argv is None else orig_argv)
    args = argv[1:]
    if list(command_argv) != argv or not args or len(orig) <= len(args):
        return None
    if orig[len(orig) - len(args) :] != args:
        return None
    return RestartCommand(tuple(orig), logical_cwd() if cwd is None else cwd)


def logical_cwd() -> str:
    """The directory as the shell named it (``$PWD``, which keeps symbolic links) when it is
    the current one: a deploy that points a ``current`` link at a new release is followed."""
    physical = os.getcwd()
    pwd = os.environ.get("PWD")
    try:
        if pwd and os.path.isabs(pwd) and os.path.samefile(pwd, physical):
            return pwd
    except OSError:
        pass
    return physical


def child_environment(spec: ChildSpec, write_fd: int, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the supervisor's environment) plus what makes ``runqueue`` this child."""
    # A field at its default is not sent: the code on disk may be an earlier release (a deploy
    # rolled back), whose ChildSpec does not know the fields added since, and fails on them.
    defaults = {f.name: f.default for f in dataclass_fields(ChildSpec) if f.default is not MISSING}
    fields = {
        name: value
        for name, value in asdict(replace(spec, name="")).items()
        if name not in defaults or value != defaults[name]
    }
    worker_class = spec.worker_class
    fields["worker_class"] = f"{worker_class.__module__}.{worker_class.__qualname__}"
    return {**base, CHILD_ENV: json.dumps({"fd": write_fd, "spec": fields})}


def take_child_invocation(
    environ: MutableMapping[str, str] | None = None,
) -> tuple[ChildSpec, int] | None:
    """In ``runqueue``: the spec and pipe this process was started with as a supervised child,
    or None. Removes the variable, so that a process a handler starts is not taken for one."""
    environ = os.environ if environ is None else environ
    raw = environ.pop(CHILD_ENV, None)
    if not raw:
        return None
    data = json.loads(raw)
    fields = dict(data["spec"])
    worker_class = import_string(fields.pop("worker_class"))
    if not (isinstance(worker_class, type) and issubclass(worker_class, SupervisedWorker)):
        raise TypeError(f"{worker_class!r} is not a SupervisedWorker")
    fields["name"] = f"{fields['supervisor_name']}.{fields['slot']}-{os.getpid()}"
    # The supervisor may run another release than the code on disk (a deploy rolled back
    # after a SIGHUP): a field this release does not know is left out rather than failing
    # every start; a field it knows but was not sent keeps its default.
    known = {f.name for f in dataclass_fields(ChildSpec)}
    spec = ChildSpec(**{k: v for k, v in fields.items() if k in known}, worker_class=worker_class)
    fd = int(data["fd"])
    os.set_inheritable(fd, False)  # the processes a handler starts do not hold the pipe
    return spec, fd
