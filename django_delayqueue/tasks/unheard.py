"""Whether sending ``task_started`` or ``task_finished`` would do nothing at all.

A worker sends both for every task; the framework connects one receiver of its own to each,
which only logs a line (at INFO; a failed task at ERROR) on its logger, ``django.tasks``
(``django_tasks`` in the backport). Under Django's default logging that logger is enabled for
INFO, but its only handler that takes INFO (``console``) lets a record through only with
``DEBUG = True``: the record is built, formatted by nobody, and dropped. Building it and the
TaskResult it names cost about a fifth of a task's run on a worker. When that is all a send
would do, the runner builds neither: the same log output, the same receivers called (none of
the user's), nothing else visible.

Anything not known to drop the record, and the send happens as the framework's own backends
do it: a receiver of the user's (sync or async), a logging filter, handler, logger or record
factory of the user's, ``DEBUG = True``, a level that lets the line through.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.utils.log import RequireDebugTrue

from django_delayqueue.tasks import framework
from django_delayqueue.tasks.payload import RUNNING, SUCCESSFUL

_OWN_RECEIVERS = {
    id(framework.task_started): framework.log_task_started,
    id(framework.task_finished): framework.log_task_finished,
}
_PLAIN_LOGGERS = (logging.Logger, logging.RootLogger)


def unheard(signal: Any, backend: Any, status: str) -> bool:
    """Whether sending ``signal`` for ``backend`` with a result of ``status`` would do nothing:
    its only live receiver is the framework's own, and the line it would log (INFO for RUNNING
    and SUCCESSFUL, ERROR otherwise) is dropped."""
    log = framework.signals_logger
    level = logging.INFO if status in (RUNNING, SUCCESSFUL) else logging.ERROR
    return log is not None and _only_own_receiver(signal, type(backend)) and dropped(log, level)


def quiet(signal: Any, backend: Any) -> bool:
    """:func:`unheard` for ``task_started`` or a success's ``task_finished`` (both INFO): what a
    worker asks at the start and at the end of every run, in one call of its own (each ask is
    the whole check: receivers and logging may change between any two)."""
    log = framework.signals_logger
    return (
        log is not None and _only_own_receiver(signal, type(backend)) and dropped(log, logging.INFO)
    )


def _only_own_receiver(signal: Any, sender: type) -> bool:
    """Whether the framework's own receiver is the only live one of ``signal`` for ``sender``.

    Kept per signal and sender while the signal's receivers stay the same: a worker asks twice
    per task, and resolving them (a lock, the weak references) shows on its profile. Any
    change is seen at the next ask: ``connect`` and ``disconnect`` change ``receivers`` (a
    list of tuples made once per connected receiver, compared by identity first, so the check
    costs little), and a receiver or sender that dies sets ``_dead_receivers``."""
    receivers = getattr(signal, "receivers", None)
    if not isinstance(receivers, list) or getattr(signal, "_dead_receivers", True):
        return _resolve_only_own(signal, sender)  # not the Signal known here: asked each time
    # The last sender asked for, per signal: a worker's tasks mostly have one backend class.
    kept = _kept.get(id(signal))
    if kept is not None and kept[0] is signal and kept[1] is sender and kept[2] == receivers:
        return kept[3]
    answer = _resolve_only_own(signal, sender)
    if len(_kept) >= _KEPT:
        _kept.clear()
    # The signal kept with it (its id is never reused meanwhile), and a copy of its list.
    _kept[id(signal)] = (signal, sender, list(receivers), answer)
    return answer


def _resolve_only_own(signal: Any, sender: type) -> bool:
    own = _OWN_RECEIVERS.get(id(signal))
    if own is None:
        return False
    try:
        live = signal._live_receivers(sender)  # Django 5.0+: (sync, async) receivers
    except Exception:
        return False
    if not isinstance(live, tuple) or len(live) != 2:  # older Django: one list, its own way
        return False
    sync, asynchronous = live
    return not asynchronous and all(receiver is own for receiver in sync)


_KEPT = 64
_kept: dict[int, tuple[Any, type, list[Any], bool]] = {}


def dropped(log: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` logged on ``log`` would reach no handler's ``emit`` and
    nothing of the user's (filter, record factory, logger class) would see it made, as
    ``Logger.callHandlers`` walks the hierarchy. Only what is known is trusted: plain loggers
    without filters, and handlers whose level is above ``level`` or that are plain (their
    ``handle`` and ``filter`` the standard ones) and whose first filter is Django's
    ``RequireDebugTrue`` while ``DEBUG`` is off. INFO only: from WARNING on, a hierarchy
    without handlers has Python's last-resort handler print it."""
    if not log.isEnabledFor(level):
        return True
    if level >= logging.WARNING or logging.getLogRecordFactory() is not logging.LogRecord:
        return False
    # Written out (the handler's test inline, DEBUG read only where a handler's level lets
    # the line through): a worker asks twice per task it runs.
    current: logging.Logger | None = log
    found = 0
    while current is not None:
        if current.filters or type(current) not in _PLAIN_LOGGERS:
            return False
        for handler in current.handlers:
            found += 1
            if level < handler.level:
                continue
            # Dropped by it only if it is plain and its first filter is Django's
            # RequireDebugTrue (the ``console`` handler of Django's default logging), with
            # DEBUG off.
            kind, filters = type(handler), handler.filters
            if (
                not (
                    filters
                    and type(filters[0]) is RequireDebugTrue
                    and kind.handle is _HANDLE
                    and kind.filter is _FILTER
                )
                or _debug()
            ):
                return False
        if not current.propagate:
            break
        current = current.parent
    # No handler at all: below WARNING, the last resort ignores it; without one, Python
    # prints "No handlers could be found" once.
    return found > 0 or logging.lastResort is not None


_HANDLE = logging.Handler.handle
_FILTER = logging.Filterer.filter


def _debug() -> bool:
    """``settings.DEBUG``, read where Django's settings keep it once read: ``settings.DEBUG``
    goes through LazyObject's ``__getattribute__`` (about 0.7 us, asked twice a task), while
    the value it caches in the instance's ``__dict__`` is dropped by Django whenever a setting
    is assigned or the settings are swapped (``override_settings``): so what is there is the
    current value, and anything else asks the settings themselves. That ``__dict__`` is the
    same object for the settings' life (Django clears it in place, never replaces it): kept."""
    cached = _SETTINGS_DICT.get("DEBUG", _UNSET)
    return bool(settings.DEBUG if cached is _UNSET else cached)


def _settings_dict() -> dict[str, Any]:
    try:
        found = object.__getattribute__(settings, "__dict__")
    except AttributeError:  # not the LazySettings known here: always asked
        return {}
    return found if isinstance(found, dict) else {}


_SETTINGS_DICT = _settings_dict()
_UNSET = object()
