"""What request code calls: ``schedule``, ``cancel``, ``get_queue``."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from django.core.signals import setting_changed
from django.db import transaction

from .conf import SETTING_NAME, dq_settings, queue_names, queue_settings, unknown_queue
from .connection import get_client, get_clock
from .core.queue import Queue
from .core.results import ScheduleResult

logger = logging.getLogger(__name__)

_queues: dict[str, Queue] = {}
_lock = threading.Lock()


def get_queue(name: str) -> Queue:
    """The configured queue ``name`` (one object per name; its settings kept current).

    Raises :class:`~django_delayqueue.core.errors.ConfigurationError` for a queue that is not
    in ``DELAYQUEUE['QUEUES']``.
    """
    q = _queues.get(name)
    if q is None:
        if name not in queue_names():
            raise unknown_queue(name)
        with _lock:
            q = _queues.get(name)
            if q is None:
                q = Queue(
                    get_client(),
                    name,
                    prefix=dq_settings.PREFIX,
                    settings=queue_settings(name),
                    clock=get_clock(),
                    journal_maxlen=dq_settings.JOURNAL_MAXLEN,
                )
                _queues[name] = q
                return q
    # Cheap: queue_settings reads Redis at most every SETTINGS_REFRESH_SECONDS.
    q.settings = queue_settings(name)
    return q


def schedule(
    queue: str,
    payload: Any,
    *,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    id: str | None = None,
    on_commit: bool | None = None,
    using: str | None = None,
    replace: bool = False,
) -> str:
    """Schedule ``payload`` on ``queue`` after ``delay`` (seconds or timedelta) or ``at``.

    Returns the message id (``id`` if given). Scheduling an id that a message still holds
    (waiting, in flight, retrying or dead) creates nothing, and says so in the log (INFO, with
    the state). With ``replace=True`` the new message replaces a waiting or dead one, or, if
    that one is being delivered, is scheduled when its delivery is acknowledged (README,
    "Re-scheduling an id"). The payload, id and due time are checked now, so a bad payload
    raises :class:`PayloadError` here. With ``on_commit`` (default ``DELAYQUEUE['ON_COMMIT']``,
    True) a call inside ``transaction.atomic`` sends the message only when the transaction
    commits, and not at all when it rolls back.
    """
    q = get_queue(queue)
    prepared = q.prepare(payload, delay=delay, at=at, id=id)
    message_id = prepared[0]

    def send() -> None:
        _log_sent(q.send_prepared(prepared, replace=replace), q.name)

    if dq_settings.ON_COMMIT if on_commit is None else on_commit:
        # Outside an atomic block Django runs the callback at once.
        transaction.on_commit(send, using=using)
    else:
        send()
    return message_id


def _log_sent(result: ScheduleResult, queue: str) -> None:
    """Never silent: a message that was not created is logged with what kept it out."""
    if not result.created:
        logger.info(
            "not scheduled %s on %s: a message with this id is already %s "
            "(replace=True replaces it)",
            result.id,
            queue,
            result.state,
        )
    elif result.successor:
        logger.debug("scheduled %s on %s after its delivery in flight", result.id, queue)
    elif result.replaced:
        logger.debug("scheduled %s on %s, replacing one %s", result.id, queue, result.state)
    else:
        logger.debug("scheduled %s on %s", result.id, queue)


def cancel(queue: str, id: str) -> bool:
    """Remove a message that is still waiting; True if one was (False: running, gone, unknown).

    A message booked with ``replace=True`` to follow a running delivery of ``id`` is removed
    too. Runs at once, not on commit: a handler that must not act on, say, a paid order checks
    the order's state anyway (delivery is at least once).
    """
    return get_queue(queue).cancel(id) > 0


def reset() -> None:
    """Forget the cached queues (after the settings changed)."""
    with _lock:
        _queues.clear()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_delayqueue.api")
