"""The Redis clients the core works with: redis-py's client for one server, or for a cluster.

Every queue's keys share one hash tag, so each script call goes to one node either way.
"""

from __future__ import annotations

from typing import TypeAlias

import redis
from redis.client import Pipeline
from redis.cluster import ClusterPipeline, RedisCluster

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
RedisPipeline: TypeAlias = "Pipeline | ClusterPipeline"
