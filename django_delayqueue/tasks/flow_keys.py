"""The flow key of a task (docs/flow-control.md, "Keys of tasks"): from one of its arguments,
named once in the backend's options, or given around an enqueue with :func:`flow_key`.

Django's ``Task`` has no field for it, and a field of our own would not survive: a task is a
frozen dataclass whose ``using()`` copies only the framework's fields, and the backport and
Django 6 build it with fixed arguments. What a key means (the phone number, the store) is
nearly always an argument the task already takes, so the backend reads it from there::

    TASKS = {"default": {
        "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
        "OPTIONS": {"KEY_ARGUMENT": "store_id"},  # or {"shop.tasks.send_sms": "phone", ...}
    }}

Declared once, it holds at every call site, for ``aenqueue``, and for the ticks of a
``@periodic`` task; nothing at a call can forget it. For the rare call whose key is not an
argument, :func:`flow_key` sets it for the enqueues inside its block (it wins over the
argument; ``flow_key(None)`` enqueues without a key).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django_delayqueue.core.envelope import validate_key
from django_delayqueue.core.errors import PayloadError

KEY_ARGUMENT = "KEY_ARGUMENT"  # the backend option
_UNSET = object()
_block_key: ContextVar[Any] = ContextVar("django_delayqueue_flow_key", default=_UNSET)


@contextmanager
def flow_key(key: str | None) -> Iterator[None]:
    """Give the tasks enqueued inside the block the flow key ``key`` (None: no key), whatever
    their key argument says. A context variable: a thread or a coroutine sees its own, and
    ``aenqueue`` (run in a copy of the caller's context) sees the caller's."""
    if key is not None:
        validate_key(key)
    token = _block_key.set(key)
    try:
        yield
    finally:
        _block_key.reset(token)


def key_argument_problem(option: Any) -> str | None:
    """What is wrong with a ``KEY_ARGUMENT`` option (None: absent, or fine)."""
    if option is None or (isinstance(option, str) and option.isidentifier()):
        return None
    if isinstance(option, Mapping) and all(
        isinstance(path, str) and "." in path and isinstance(name, str) and name.isidentifier()
        for path, name in option.items()
    ):
        return None
    return (
        "KEY_ARGUMENT must be the name of an argument (e.g. 'store_id') or a dict of a task's "
        f"dotted path to the name of its argument, not {option!r}"
    )


def task_key(task: Any, args: Any, kwargs: Mapping[str, Any], option: Any) -> str | None:
    """The flow key of ``task`` enqueued with ``args`` and ``kwargs``: the one of an enclosing
    :func:`flow_key` block, else its key argument's value (str, or an int as its text), else
    None. PayloadError (also a TypeError) for a value that cannot be a key."""
    given = _block_key.get()
    if given is not _UNSET:
        return given
    return argument_key(task, args, kwargs, option)


def schedule_task_key(path: str, alias: str, args: Any, kwargs: Mapping[str, Any]) -> str | None:
    """The key argument's value for a recurring schedule's ``task`` (at ``path``, run by
    TASKS[``alias``]) with its ``args`` and ``kwargs``; None when that backend names none."""
    from django.utils.module_loading import import_string

    from django_delayqueue.tasks import framework

    try:
        option = getattr(framework.task_backends[alias], "options", {}).get(KEY_ARGUMENT)
    except Exception:  # no such backend: the checks report it (E009), the tick says why
        return None
    if option is None:
        return None
    return argument_key(import_string(path), args, kwargs, option)


def argument_key(task: Any, args: Any, kwargs: Mapping[str, Any], option: Any) -> str | None:
    """The value of ``task``'s key argument (named by ``option``) in a call, as a key."""
    name = _argument_name(task, option)
    if name is None:
        return None
    value = _argument(task, name, args, kwargs)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    try:
        return validate_key(value)
    except PayloadError as e:
        raise KeyArgumentError(f"task {task.module_path}: argument {name!r}: {e}") from e


class KeyArgumentError(PayloadError, TypeError):
    """A key argument whose value cannot be a flow key: a ``TypeError`` like any argument the
    backend cannot take, and a ``PayloadError`` like every key ``schedule()`` refuses."""


def _argument_name(task: Any, option: Any) -> str | None:
    if isinstance(option, str):
        return option
    if isinstance(option, Mapping):
        return option.get(task.module_path)
    return None


def _argument(task: Any, name: str, args: Any, kwargs: Mapping[str, Any]) -> Any:
    """The value ``name`` takes in the call (positional, by name or its default); None if the
    task has no such argument (a backend-wide name fits only the tasks that take it)."""
    if name in kwargs:
        return kwargs[name]
    try:
        parameters = list(inspect.signature(task.func).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature: by name only
        return None
    if getattr(task, "takes_context", False):
        parameters = parameters[1:]  # the context is not among the enqueued arguments
    for position, parameter in enumerate(parameters):
        if parameter.name != name:
            continue
        positional = parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        if positional and position < len(args):
            return args[position]
        return None if parameter.default is parameter.empty else parameter.default
    return None
