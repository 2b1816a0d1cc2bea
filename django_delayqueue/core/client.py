"""The Redis clients the core works with: redis-py's client for one server, or for a cluster.

Every queue's keys share one hash tag, so each script call goes to one node either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis
from redis.client import Pipeline
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.connection import parse_url

from django_delayqueue.core.errors import ConfigurationError

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
RedisPipeline: TypeAlias = "Pipeline | ClusterPipeline"


def connect(url: str | Sequence[str], *, cluster: bool = False, **options: Any) -> RedisClient:
    """A client for ``url``: one server, or (``cluster``) a Redis Cluster that ``url`` names a
    node of, or a list of start nodes (the first URL's credentials and TLS apply to all).

    Picklable arguments, so a Spark executor can build its own from what the driver passed.
    RESP2 unless ``options`` say otherwise: what the code expects, whichever redis-py default.
    """
    options.setdefault("protocol", 2)
    if not cluster:
        if not isinstance(url, str):
            raise ConfigurationError("a list of Redis URLs needs a cluster (CLUSTER = True)")
        return redis.Redis.from_url(url, **options)
    urls = [url] if isinstance(url, str) else [str(u) for u in url]
    if not urls:
        raise ConfigurationError("no Redis Cluster start node given")
    if len(urls) == 1:
        return RedisCluster.from_url(urls[0], **options)
    shared = {
        key: value
        for key, value in parse_url(urls[0]).items()
        if key not in ("host", "port", "db", "path", "connection_class")
    }
    if urls[0].startswith("rediss://"):
        shared["ssl"] = True
    nodes = []
    for u in urls:
        parts = urlsplit(u)
        if not parts.hostname:
            raise ConfigurationError(f"Redis Cluster start node {u!r} names no host")
        nodes.append(ClusterNode(parts.hostname, parts.port or 6379))
    return RedisCluster(startup_nodes=nodes, **{**shared, **options})
