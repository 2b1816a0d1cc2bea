"""A task's record as the framework's ``TaskResult``, and its Task found from its module path."""

from __future__ import annotations

import dataclasses
import sys
from datetime import datetime, timezone
from functools import cache
from typing import Any

from django.conf import settings
from django.utils import timezone as django_timezone
from django.utils.module_loading import import_string

from django_delayqueue.tasks import framework
from django_delayqueue.tasks.payload import SUCCESSFUL, TaskRecord


def to_task_result(record: TaskRecord, result_id: str, task: Any = None) -> Any:
    """The framework's ``TaskResult`` of ``record``; its Task is ``task``, or imported."""
    if task is None:
        task = task_as_enqueued(load_task(record.task), record)
    aware = settings.USE_TZ  # read once: a setting is a lookup through Django's LazySettings
    values = {
        "task": task,
        "id": result_id,
        "status": _status(record.status),
        "enqueued_at": to_datetime(record.enqueued_at, aware),
        "started_at": to_datetime(record.started_at, aware),
        "finished_at": to_datetime(record.finished_at, aware),
        "last_attempted_at": to_datetime(record.last_attempted_at, aware),
        "args": list(record.args),
        "kwargs": dict(record.kwargs),
        "backend": record.backend,
        "errors": [framework.TaskError(**error) for error in record.errors],
        "worker_ids": list(record.worker_ids),
    }
    return _result(values, record.return_value)


def _result(values: dict[str, Any], return_value: Any) -> Any:
    """A ``TaskResult`` of ``values``: built field by field where its fields are these (and
    ``_return_value``), as in every framework version this app supports; through its
    ``__init__`` otherwise. Its ``__post_init__`` would only normalise the arguments, which
    came out of JSON and are normal already; it shows on a worker's profile."""
    kind = framework.TaskResult
    if _field_set(kind) == _RESULT_FIELDS and values.keys() == _RESULT_VALUES:
        result = object.__new__(kind)
        for name, value in values.items():
            object.__setattr__(result, name, value)
    else:
        result = kind(**values)
    object.__setattr__(result, "_return_value", return_value)
    return result


_RESULT_VALUES = frozenset(
    [
        "task",
        "id",
        "status",
        "enqueued_at",
        "started_at",
        "finished_at",
        "last_attempted_at",
        "args",
        "kwargs",
        "backend",
        "errors",
        "worker_ids",
    ]
)
_RESULT_FIELDS = _RESULT_VALUES | {"_return_value"}


def _status(name: str) -> Any:
    """The framework's status of a record's ``status``."""
    return framework.SUCCESSFUL if name == SUCCESSFUL else getattr(framework.TaskResultStatus, name)


def finished_result(started: Any, record: TaskRecord) -> Any:
    """The ``TaskResult`` of ``record`` once its run ended, from ``started``, the one its run
    began with (same task, id, arguments): a copy with the fields that changed, without
    building and normalising it all again on the worker's hot path."""
    result = _copy(started)
    object.__setattr__(result, "status", _status(record.status))
    object.__setattr__(result, "finished_at", to_datetime(record.finished_at))
    object.__setattr__(result, "errors", [framework.TaskError(**e) for e in record.errors])
    object.__setattr__(result, "worker_ids", list(record.worker_ids))
    object.__setattr__(result, "_return_value", record.return_value)
    return result


def task_as_enqueued(task: Any, record: TaskRecord) -> Any:
    """``task`` with the record's priority, queue, backend and run_after.

    Not ``task.using()``: that validates the task again (signature inspection and all), on
    every read of a result; the task was validated when it was enqueued. The last few are
    kept: a worker runs the same few tasks with the same options over and over.
    """
    options = (record.priority, record.queue, record.backend, record.run_after)
    kept = _as_enqueued.get(id(task))
    if kept is not None and kept[0] is task and kept[1] == options:
        return kept[2]
    changed = _copy(task)
    object.__setattr__(changed, "priority", record.priority)
    object.__setattr__(changed, "queue_name", record.queue)
    object.__setattr__(changed, "backend", record.backend)
    object.__setattr__(changed, "run_after", to_datetime(record.run_after))
    if len(_as_enqueued) >= _AS_ENQUEUED_KEPT:
        _as_enqueued.clear()
    # By the task object's id, the object kept with it (so that its id is not reused), and
    # the last options only: a frozen Task is never changed in place, so this copy stays true.
    _as_enqueued[id(task)] = (task, options, changed)
    return changed


_AS_ENQUEUED_KEPT = 256
_as_enqueued: dict[int, tuple[Any, tuple[Any, ...], Any]] = {}


def _copy(value: Any) -> Any:
    """A field-by-field copy of a frozen dataclass (a Task or a TaskResult), without its
    ``__init__`` (nor the validation and normalisation it repeats)."""
    kind: type = type(value)
    copied: Any = object.__new__(kind)
    for name in _field_names(kind):
        object.__setattr__(copied, name, getattr(value, name))
    return copied


@cache
def _field_set(kind: type) -> frozenset[str]:
    return frozenset(_field_names(kind))


@cache
def _field_names(kind: type) -> tuple[str, ...]:
    """The fields of a dataclass, ``init=False`` ones included (``dataclasses.fields`` on a
    slotted class is slow enough to show on a worker's profile)."""
    return tuple(spec.name for spec in dataclasses.fields(kind))


def stand_in_task(record: TaskRecord) -> Any:
    """A Task for ``record`` whose function this process cannot import (a worker deployed
    before the code that enqueued it): its module path and the record's options, so that
    ``task_finished`` can say the task failed. Calling it raises ImportError."""
    path = record.task
    module, _, name = path.rpartition(".")

    def cannot_import(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"cannot import task {path!r}")

    cannot_import.__module__, cannot_import.__name__, cannot_import.__qualname__ = (
        module,
        name,
        name,
    )
    task = object.__new__(framework.Task)
    # Defaults (none before django-tasks 0.9), then ours.
    for spec in dataclasses.fields(framework.Task):
        value = None if spec.default is dataclasses.MISSING else spec.default
        if spec.default_factory is not dataclasses.MISSING:
            value = spec.default_factory()
        object.__setattr__(task, spec.name, value)
    object.__setattr__(task, "func", cannot_import)
    return task_as_enqueued(task, record)


def load_task(path: str) -> Any:
    """The Task object at ``path``; ImportError for anything else (never a plain function)."""
    # A worker loads the same few tasks over and over: the one found last time, while its
    # module still holds it under that name (the test import_string's own cache makes, less
    # the split of the path and the checks of a module still importing, which it passed).
    kept = _loaded.get(path)
    if kept is not None:
        module = sys.modules.get(kept[0])
        if module is not None and getattr(module, kept[1], None) is kept[2]:
            return kept[2]
    task = _import_task(path)
    if len(_loaded) >= _LOADED_KEPT:
        _loaded.clear()
    module_path, _, name = path.rpartition(".")
    _loaded[path] = (module_path, name, task)
    return task


_LOADED_KEPT = 256
_loaded: dict[str, tuple[str, str, Any]] = {}


def _import_task(path: str) -> Any:
    try:
        task = import_string(path)
    except ImportError:
        raise
    except Exception as e:  # a module that fails as it loads: an ImportError naming the task
        raise ImportError(f"cannot import task {path!r}: {e}") from e
    if not isinstance(task, framework.Task):
        raise ImportError(f"{path!r} is not a task (decorate it with @task)")
    return task


def to_datetime(ms: int | None, aware: bool | None = None) -> datetime | None:
    """``ms`` (epoch milliseconds) as a datetime: aware with ``USE_TZ`` (``aware``, when the
    caller read it already), naive in the current time zone otherwise."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    if settings.USE_TZ if aware is None else aware:
        return moment
    return django_timezone.make_naive(moment)
