"""The supervisor's side of a handler that could not be stopped: settled once its process is
gone (core.consumer.limits.stopped), and nothing left open across a fork.

The supervisor is one thread: while it waits on Redis it neither reaps, nor replaces dead
children, nor answers SIGTERM, nor kills an overdue child. So it settles through a client of its
own that never retries and gives up on a Redis that does not answer within
:data:`SETTLE_TIMEOUT_SECONDS` (the shared client waits 5 s for a connection and 30 s for a
reply, and retries as redis-py's defaults or ``REDIS_OPTIONS`` say: an unreachable host held
the loop for about a minute per message), stops at the first outage (what is left is
tried again later, see ``Supervisor._settle_left``), and reads the queues' published settings
through that client too. (A ``CACHE_ALIAS`` client is django-redis's own, with its options.)
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import redis
from django.db import connections

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler, settle_stopped
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, ScriptFailed
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.scripts.calls import is_out_of_memory, passes_by_itself
from django_delayqueue.observability.log_fields import id_fields
from django_delayqueue.supervisor.start_marks import Unstarted

logger = logging.getLogger(__name__)

# Connect and reply timeout of the settling client: one outage costs the loop this much.
SETTLE_TIMEOUT_SECONDS = 1.0

# What became of a stopped message, by nack's result: its attempts may have run out. A token
# already spent (0) is most often the process's own doing: a handler that ended before its
# process did (a coroutine's thread finishing, say) has its outcome recorded by the process.
SETTLED = {
    0: "already settled (by its process once the handler ended, or by its visibility timeout)",
    1: "retried",
    2: "dead-lettered",
    3: "dead-lettered as aborted (an abort came before it was settled)",
}

_settling: tuple[Any, Any] | None = None  # (client, clock), built on first use


def refused_for_good(error: BaseException) -> bool:
    """Whether Redis refused a settling call for good (a script error: a key of one queue
    holding the wrong type, say), not because it is down, out of memory or failing over: that
    call is given up (its message comes back after its visibility timeout) and the others go
    on, instead of every queue's waiting behind it, tried again for ever."""
    if isinstance(error, redis.ResponseError) and is_out_of_memory(error):
        return False
    return isinstance(error, (ScriptFailed, redis.ResponseError)) and not passes_by_itself(error)


_Item = TypeVar("_Item", StoppedHandler, Unstarted)


def _outage(error: BaseException, left: list[_Item], what: str, *, final: bool) -> list[_Item]:
    """Redis is down: ``left`` (``what`` says what they are) waits for the next try, returned;
    at the ``final`` try none does: they are named in a log line and left in flight, to come
    back after their visibility timeout (an attempt used)."""
    if final:
        logger.error(
            "Redis unavailable (%s): %d %s left in flight, they come back after their "
            "visibility timeout (an attempt used): %s",
            error,
            len(left),
            what,
            ", ".join(f"{x.queue}/{x.message_id}" for x in left),
        )
        return []
    logger.warning("Redis unavailable (%s): %d %s tried again later", error, len(left), what)
    return list(left)


def settle(stopped: list[StoppedHandler], *, final: bool = False) -> list[StoppedHandler]:
    """Record the outcome of each of ``stopped`` (their process has been reaped); returns those
    to try again: at the first sign of Redis being down, that one and every one after it
    (``final``: none, they are named in a log line and left to their visibility timeout)."""
    for index, item in enumerate(stopped):
        try:
            (outcome,) = settle_stopped(_queues_for(item.queue), [item])
        except ConfigurationError as e:
            logger.error(
                "queue %s: message %s not settled: %s",
                item.queue,
                item.message_id,
                e,
                extra=id_fields(item.queue, item.message_id, item.attempt),
            )
            continue
        except (KeyError, ValueError, TypeError) as e:  # a queue this process cannot name
            logger.error(
                "queue %s: message %s not settled (%r): it comes back after its visibility timeout",
                item.queue,
                item.message_id,
                e,
                extra=id_fields(item.queue, item.message_id, item.attempt),
            )
            continue
        except (DelayQueueError, redis.RedisError) as e:
            if refused_for_good(e):  # this queue's keys, say: the other queues go on
                logger.error(
                    "queue %s: message %s not settled, Redis refused it (%s): it comes back "
                    "after its visibility timeout",
                    item.queue,
                    item.message_id,
                    e,
                    extra=id_fields(item.queue, item.message_id, item.attempt),
                )
                continue
            return _outage(e, stopped[index:], "stopped message(s)", final=final)
        logger.warning(
            "queue %s: message %s stopped (%s): %s",
            item.queue,
            item.message_id,
            item.reason,
            SETTLED[outcome],
            extra=id_fields(item.queue, item.message_id, item.attempt),
        )
    return []


def give_back(unstarted: list[Unstarted], *, final: bool = False) -> list[Unstarted]:
    """Give back what processes that are gone (reaped) claimed and never started, through
    release.lua: no attempt used, an aborted one to the dead letters with its abort's reason, a
    token no longer current skipped. One call per queue and process; returns those to try again
    (Redis down: that group and every one after it; ``final``: none, they are named in a log
    line and come back after their visibility timeout, charged)."""
    groups: dict[tuple[str, int], list[Unstarted]] = {}
    for item in unstarted:
        groups.setdefault((item.queue, item.pid), []).append(item)
    done: set[tuple[str, int]] = set()
    for (queue, pid), items in groups.items():
        ids = ", ".join(u.message_id for u in items)
        try:
            released = _queues_for(queue)[queue].release(*(u.message() for u in items))
        except ConfigurationError as e:
            logger.error(
                "queue %s: %d unstarted message(s) not given back: %s", queue, len(items), e
            )
            done.add((queue, pid))
            continue
        except (KeyError, ValueError, TypeError) as e:  # a queue this process cannot name
            logger.error(
                "queue %s: %d unstarted message(s) not given back (%r): they come back after "
                "their visibility timeout: %s",
                queue,
                len(items),
                e,
                ids,
            )
            done.add((queue, pid))
            continue
        except (DelayQueueError, redis.RedisError) as e:
            if refused_for_good(e):  # this queue's keys, say: the other queues go on
                logger.error(
                    "queue %s: %d unstarted message(s) not given back, Redis refused them "
                    "(%s): they come back after their visibility timeout: %s",
                    queue,
                    len(items),
                    e,
                    ids,
                )
                done.add((queue, pid))
                continue
            left = [u for u in unstarted if (u.queue, u.pid) not in done]
            return _outage(e, left, "message(s) claimed and never started", final=final)
        done.add((queue, pid))
        logger.warning(
            "queue %s: %d message(s) consumer process %d claimed and never started given back "
            "(no attempt used)%s: %s",
            queue,
            released,
            pid,
            ""
            if released == len(items)
            else f"; {len(items) - released} settled already or aborted (dead-lettered)",
            ids,
        )
    return []


def settling_client() -> Any:
    """The supervisor's own Redis client (no retries, short timeouts): for what it writes
    itself, which must never hold its loop long."""
    return _settling_client()[0]


def _settling_client() -> tuple[Any, Any]:
    """The supervisor's own client (no retries, short timeouts) and a clock reading it."""
    global _settling
    if _settling is None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from django_delayqueue.conf.connection import make_client
        from django_delayqueue.conf.settings import dq_settings
        from django_delayqueue.core.clock import RedisClock, SystemClock

        client = make_client(
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=SETTLE_TIMEOUT_SECONDS,
            socket_timeout=SETTLE_TIMEOUT_SECONDS,
        )
        clock = SystemClock() if dq_settings.CLOCK == "system" else RedisClock(client)
        _settling = (client, clock)
    return _settling


def _queues_for(physical: str) -> dict[str, Queue]:
    """Queue objects of the (logical) queue ``physical`` belongs to, by physical name, on the
    settling client, with the published settings read through it too."""
    from django_delayqueue.conf.connection import replica_ack
    from django_delayqueue.conf.settings import dq_settings, file_queue_settings, queue_shards
    from django_delayqueue.mirror.queue_overrides import load_published, merge

    client, clock = _settling_client()
    logical = physical.split("#", 1)[0]
    settings = merge(file_queue_settings(logical), load_published([logical], client)[logical])
    count = queue_shards(logical)
    queues = [
        Queue(
            client,
            logical,
            prefix=dq_settings.PREFIX,
            settings=settings,
            clock=clock,
            journal_maxlen=int(dq_settings.JOURNAL_MAXLEN),
            replicas=replica_ack(),
            shard=None if count == 1 else index,
            shards=count,
        )
        for index in range(count)
    ]
    return {q.name: q for q in queues}


def close_connections() -> None:
    """Nothing open across a fork: Django's database connections and the Redis pools (a child
    would share their sockets with its parent). The clients stay usable: each reconnects on
    its next command (the supervisor settles through its own after a fork)."""
    connections.close_all()
    from django_delayqueue.conf.connection import get_client

    clients = [_settling[0]] if _settling is not None else []
    try:
        clients.append(get_client())
    except Exception as e:  # bad settings: the children will say so
        logger.debug("Redis connections not closed before fork: %s", e)
    for client in clients:
        try:
            disconnect(client)
        except Exception as e:
            logger.debug("Redis connections not closed before fork: %s", e)


def disconnect(client: Any) -> None:
    """Close the sockets of ``client`` and leave it usable. A cluster client has one pool per
    node: ``RedisCluster.close()`` would also forget its nodes (redis-py 5.1 and later), and
    every command after it fails with "The cluster has no default node"."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()
        return
    nodes = getattr(client, "get_nodes", None)
    if nodes is not None:  # a cluster client
        for node in nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


def forget_inherited_connections() -> None:
    """In a child just forked: build every Redis client anew on first use, from the settings.

    What the child inherited is its supervisor's (its pools, the cluster's view of its nodes,
    a Sentinel's idea of the primary, the settling client): a child's connections are its own.
    """
    global _settling
    from django_delayqueue.conf.caches import reset_all

    _settling = None
    reset_all()
