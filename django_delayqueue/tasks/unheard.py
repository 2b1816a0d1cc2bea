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
    its only live receiver is the framework's own, and the line it would log is dropped."""
    own, log = _OWN_RECEIVERS.get(id(signal)), framework.signals_logger
    if own is None or log is None:
        return False
    try:
        live = signal._live_receivers(type(backend))  # Django 5.0+: (sync, async) receivers
    except Exception:
        return False
    if not isinstance(live, tuple) or len(live) != 2:  # older Django: one list, its own way
        return False
    sync, asynchronous = live
    if asynchronous or any(receiver is not own for receiver in sync):
        return False
    level = logging.INFO if status in (RUNNING, SUCCESSFUL) else logging.ERROR
    return dropped(log, level)


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
    current: logging.Logger | None = log
    found = 0
    while current is not None:
        if type(current) not in _PLAIN_LOGGERS or current.filters:
            return False
        for handler in current.handlers:
            found += 1
            if level >= handler.level and not _rejects(handler):
                return False
        if not current.propagate:
            break
        current = current.parent
    # No handler at all: below WARNING, the last resort ignores it; without one, Python
    # prints "No handlers could be found" once.
    return found > 0 or logging.lastResort is not None


def _rejects(handler: logging.Handler) -> bool:
    """Whether ``handler`` drops every record at its first filter, Django's RequireDebugTrue
    (the ``console`` handler of Django's default logging) with ``DEBUG`` off."""
    kind = type(handler)
    return (
        kind.handle is logging.Handler.handle
        and kind.filter is logging.Filterer.filter
        and bool(handler.filters)
        and type(handler.filters[0]) is RequireDebugTrue
        and not settings.DEBUG
    )
