"""After a round's acks, with ``MIN_REPLICAS``: the replicas have them before the round goes on
(a part of the recording of outcomes, django_delayqueue.core.consumer.rounds.recording)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster

from django_delayqueue.core.queue import Queue

logger = logging.getLogger(__name__)


def confirm_acks(flush: Sequence[tuple[Queue, str, Any, int]]) -> None:
    """With ``MIN_REPLICAS``, wait for the replicas to have the acks just sent, so that a
    failover does not bring acknowledged messages back. One WAIT covers every queue of the
    server; a timeout is logged, not raised: the deliveries are done, and at worst a failover
    delivers them again (at least once)."""
    queues = [q for q, kind, _, _ in flush if kind == "ack" and q.replicas is not None]
    # One check per server: every queue of a plain client shares it; on a cluster, each
    # queue's slot has its own primary.
    by_server: dict[object, Queue] = {}
    for q in queues:
        client = q.client
        server = (
            client.get_node_from_key(q.keys.replicated).name
            if isinstance(client, RedisCluster)
            else id(client)
        )
        by_server.setdefault(server, q)
    for q in by_server.values():
        try:
            q.confirm_replicas("acknowledgements")
        except Exception as e:  # a WAIT error reply too: never lose the round's claims to it
            logger.warning("%s; a failover now may deliver them again", e)
