"""Publishing every recurring schedule's definition to Redis, where each runqueue reads them.

The Django layer decides what is published (django_delayqueue.recurring.definitions); this is
the one write, ``publish_recurrences.lua``, whose version only grows.
"""

from __future__ import annotations

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.keys import published_recurrences_key
from django_delayqueue.core.scripts.contracts import PUBLISH_RECURRENCES


def publish_definitions(client: RedisClient, prefix: str, definitions: str) -> int:
    """Publish ``definitions`` (every schedule, JSON) for the site of key prefix ``prefix``;
    returns the new version. Raises RedisUnavailable when Redis is down."""
    call = PUBLISH_RECURRENCES.call(
        published=published_recurrences_key(prefix), definitions=definitions
    )
    return int(call.run(client))
