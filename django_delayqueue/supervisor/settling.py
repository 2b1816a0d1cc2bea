"""The supervisor's side of a handler that could not be stopped: settled once its process is
gone (core.consumer.stopped), and nothing left open across a fork."""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

from django_delayqueue.core.consumer.stopped import StoppedHandler, settle_stopped
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError

logger = logging.getLogger(__name__)


def settle(stopped: list[StoppedHandler], *, final: bool = False) -> list[StoppedHandler]:
    """Record the outcome of each of ``stopped`` (their process has been reaped); returns those
    to try again (Redis down; ``final``: none, they are left to their visibility timeout)."""
    left: list[StoppedHandler] = []
    for item in stopped:
        try:
            settle_stopped(_queues_for(item.queue), [item])
        except ConfigurationError as e:
            logger.error("queue %s: message %s not settled: %s", item.queue, item.message_id, e)
            continue
        except (KeyError, ValueError, TypeError) as e:  # a queue this process cannot name
            logger.error(
                "queue %s: message %s not settled (%r): it comes back after its visibility timeout",
                item.queue,
                item.message_id,
                e,
            )
            continue
        except DelayQueueError as e:  # Redis down: again in a second (or its timeout)
            if final:
                logger.error("message %s left to its visibility timeout: %s", item.message_id, e)
            else:
                left.append(item)
            continue
        logger.warning(
            "queue %s: message %s stopped (%s): %s",
            item.queue,
            item.message_id,
            item.reason,
            "retried" if item.settlement == "retry" else "dead-lettered",
        )
    return left


def _queues_for(physical: str) -> dict[str, Any]:
    """Queue objects of the (logical) queue ``physical`` belongs to, by physical name."""
    from django_delayqueue.conf.queues import queue_settings, shard_queues

    logical = physical.split("#", 1)[0]
    return {q.name: q for q in shard_queues(logical, queue_settings(logical))}


def close_connections() -> None:
    """Nothing open across a fork: Django's database connections and the Redis pool (a child
    would share their sockets with its parent)."""
    connections.close_all()
    from django_delayqueue.conf.connection import get_client

    try:
        client = get_client()
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            pool.disconnect()
        elif hasattr(client, "close"):  # a cluster client: one pool per node
            client.close()
    except Exception as e:  # bad settings: the children will say so
        logger.debug("Redis connections not closed before fork: %s", e)
