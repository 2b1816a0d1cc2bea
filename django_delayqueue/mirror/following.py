"""A process following what staff publish: its queues' settings read back from Redis.

The last arrow of the mirror (settings file -> rows -> Redis -> every process): at each refresh
a worker reads the published settings of its queues (:func:`follow_queue_settings`, one round
trip for all of them) and puts a queue's rows back in Redis when Redis lost them (a restart
without persistence, FLUSHALL); at its start ``runqueue`` mirrors the settings file into the
rows (:func:`sync_settings`). Kept apart from the worker (``django_delayqueue.worker``), which
only decides when to refresh, because this is the mirror's business: which values win, and
what to do when a side is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, close_old_connections

from django_delayqueue.conf.settings import file_queue_settings, queue_names
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError
from django_delayqueue.core.queue import Queue
from django_delayqueue.mirror import queue_overrides
from django_delayqueue.mirror.kinds import MIRRORS, queue_settings_mirror

logger = logging.getLogger(__name__)


def follow_queue_settings(queues: Sequence[Queue], sync: Callable[[], None]) -> bool:
    """Reload the published settings of every queue of ``queues`` (and republish them if
    missing, with ``sync`` when they have no row either); False when Redis could not be read
    (nothing changed)."""
    names = list(dict.fromkeys(q.logical_name for q in queues))  # shards share theirs
    try:
        published = queue_overrides.load_published(names)
    except DelayQueueError as e:
        logger.debug("settings refresh skipped: %s", e)
        return False
    for q in queues:
        try:
            base = file_queue_settings(q.logical_name)
        except ConfigurationError:
            continue  # settings became invalid under override_settings; keep the last
        new = queue_overrides.merge(base, published[q.logical_name])
        if new != q.settings:
            logger.info("queue %s: settings now %s", q.name, _diff(q.settings, new))
            q.settings = new
    configured_names = set(queue_names())  # a queue only the registry knows has no row
    missing = [n for n, values in published.items() if values is None and n in configured_names]
    if missing:  # recomputed every refresh, so a failed republish is tried again
        _republish(missing, sync)
    return True


def _republish(names: list[str], sync: Callable[[], None]) -> None:
    # Redis lost the config hashes (restart without persistence, FLUSHALL): put the rows
    # back. One DB query per refresh at most, and only in that case.
    try:
        count = queue_settings_mirror.publish_from_db(names=names)
    except (DatabaseError, DelayQueueError) as e:
        logger.debug("settings not republished: %s", e)
        return
    finally:
        close_old_connections()
    if count:
        logger.info("republished settings of %s", ", ".join(names))
    if count < len(names):
        # No row yet (the database was down when this worker started and synced): create
        # the rows from the settings file, which publishes them too.
        sync()


def sync_settings() -> None:
    """Mirror the settings file into the rows and Redis; never raises (logs and retries)."""
    try:
        for mirror in MIRRORS:
            mirror.sync()
    except DatabaseError as e:
        logger.warning("settings rows not synced (database unavailable?): %s", e)
    finally:
        close_old_connections()


def _diff(old: Any, new: Any) -> str:
    a, b = old.to_mapping(), new.to_mapping()
    return ", ".join(f"{k}={b[k]!r}" for k in b if a.get(k) != b[k]) or "unchanged"
