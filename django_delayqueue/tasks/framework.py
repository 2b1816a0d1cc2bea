"""Django's Tasks framework, from ``django.tasks`` or from the ``django-tasks`` backport.

Django 6.0 ships ``django.tasks``; on Django 4.2-5.2 the ``django-tasks`` package provides
the same API as ``django_tasks``, under names that changed between its releases:
``ResultDoesNotExist``, ``ResultStatus`` and the ``tasks`` handler (up to 0.8) became
``TaskResultDoesNotExist``, ``TaskResultStatus`` and ``task_backends`` (0.9); a successful
task is ``SUCCEEDED`` up to 0.11 and ``SUCCESSFUL`` from 0.12 on (as in Django); and
``InvalidTaskError`` is Django's ``InvalidTask``. Everything else in this package imports those
names from here, so each of them is spelled once.
"""

from __future__ import annotations

import threading
from importlib import import_module
from types import ModuleType
from typing import Any


def _first(*modules: str) -> ModuleType:
    for name in modules:
        try:
            return import_module(name)
        except ImportError:
            continue
    raise ImportError(
        "django_delayqueue.tasks needs Django's Tasks framework: Django 6.0 or later "
        "(django.tasks), or the backport on Django 4.2-5.2: pip install 'django-tasks>=0.8'"
    )


def _pick(module: ModuleType, *names: str) -> Any:
    for name in names:
        if hasattr(module, name):
            return getattr(module, name)
    raise ImportError(f"{module.__name__} has none of {', '.join(names)}")


try:
    import_module("django.tasks.backends.base")
    PACKAGE = "django.tasks"
except ImportError:
    PACKAGE = "django_tasks"

_root = _first(PACKAGE)
_base = _first(f"{PACKAGE}.base", f"{PACKAGE}.task")  # the backport before 0.9: task.py
_backends = _first(f"{PACKAGE}.backends.base")
_exceptions = _first(f"{PACKAGE}.exceptions")
_signals = _first(f"{PACKAGE}.signals")

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskResult: Any = _base.TaskResult
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResultStatus: Any = _pick(_base, "TaskResultStatus", "ResultStatus")
SUCCESSFUL: Any = _pick(TaskResultStatus, "SUCCESSFUL", "SUCCEEDED")
InvalidTask: Any = _pick(_exceptions, "InvalidTask", "InvalidTaskError")
TaskResultDoesNotExist: Any = _pick(_exceptions, "TaskResultDoesNotExist", "ResultDoesNotExist")
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
# The framework's own receivers of task_started and task_finished: each only logs on its logger
# ("django.tasks"; "django_tasks" in the backport), started at INFO, finished at INFO or, for a
# failed task, ERROR. None where the framework has none.
log_task_started: Any = getattr(_signals, "log_task_started", None)
log_task_finished: Any = getattr(_signals, "log_task_finished", None)
signals_logger: Any = getattr(_signals, "logger", None)
task_backends: Any = _pick(_root, "task_backends", "tasks")  # "tasks" up to 0.8
# What TaskResult does to args and kwargs (Django 6.0, the backport from 0.9): a TypeError
# "Unsupported type: ..." for what is not JSON. None where the framework has none.
normalize_json: Any = getattr(_base, "normalize_json", None)


def forget_backends() -> None:
    """Forget the task backends built so far, as the framework does when ``TASKS`` changes.

    Django 6 and the backport connect a ``setting_changed`` receiver doing this; the backport up
    to 0.8 connects it in its AppConfig only, so a project (or its tests) without
    "django_tasks" in INSTALLED_APPS kept the backend built for the old ``TASKS``: an
    ``override_settings(TASKS=...)`` then enqueued through the previous backend, or refused a
    queue the new one takes. Doing it once more where the framework did is harmless.
    """
    from asgiref.local import Local

    handler = task_backends
    if hasattr(handler, "_connections") and hasattr(handler, "configure_settings"):
        handler._settings = handler.settings = handler.configure_settings(None)
        handler._connections = Local()


def backend_named(alias: str) -> Any:
    """``task_backends[alias]``, kept per thread while the framework keeps the same backends.

    A worker asks for the backend of every task it runs; the handler's own lookup goes through
    asgiref's ``Local`` (a context variable read, an attribute of a per-thread object), which
    showed on its profile. The answer is the same object the handler gives this thread, kept
    with the handler's ``_connections`` it came from and the handler's item changes seen so
    far: a change of ``TASKS`` (the framework's ``setting_changed`` receiver, or
    :func:`forget_backends`) replaces the former, ``del task_backends[alias]`` or an
    assignment the latter, and the next ask looks it up again. Raises what the handler raises
    for an alias it does not know.
    """
    handler = task_backends
    connections = getattr(handler, "_connections", None)
    kept = getattr(_kept_backends, "by_alias", None)
    if kept is None:
        kept = _kept_backends.by_alias = {}
    found = kept.get(alias)
    if (
        found is not None
        and found[0] is handler
        and found[1] is connections
        and found[2] is _item_changes[0]
    ):
        return found[3]
    changes = _item_changes[0]  # read before the lookup: a change during it is seen next time
    backend = handler[alias]
    if connections is None:  # not the handler known here: asked each time
        return backend
    if len(kept) >= 64:
        kept.clear()
    kept[alias] = (handler, connections, changes, backend)
    return backend


_kept_backends = threading.local()
# A new token at each ``del task_backends[alias]`` or ``task_backends[alias] = ...``: the
# handler sends no signal for them and keeps its ``_connections``, so the backends kept by
# backend_named would outlive the one the handler now gives.
_item_changes: list[object] = [object()]


def _follow_item_changes(handler_class: type) -> None:
    """Wrap the handler class's ``__setitem__`` and ``__delitem__`` (once) to renew the token.

    The class, not the instance: Python looks dunder methods up on the type. The wrap adds only
    a list store to a call made when a backend is replaced, never on a task's run.
    """
    for name in ("__setitem__", "__delitem__"):
        original = getattr(handler_class, name, None)
        if original is None or getattr(original, "_renews_backend_token", False):
            continue

        def changed(self: Any, *args: Any, _original: Any = original) -> Any:
            try:
                return _original(self, *args)
            finally:
                _item_changes[0] = object()

        changed._renews_backend_token = True  # type: ignore[attr-defined]
        changed.__name__ = name
        changed.__doc__ = original.__doc__
        setattr(handler_class, name, changed)


_follow_item_changes(type(task_backends))
