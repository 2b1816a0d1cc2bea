"""What the Spark commands share: the optional-import guard, the Redis URL, the session.

Not a command (Django skips modules whose names start with an underscore). The commands
import pyspark only inside ``handle`` through :func:`spark_session`, so ``manage.py help``
and the rest of the app work without pyspark or Java.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from django_delayqueue.conf.settings import DEFAULT_REDIS_URL, dq_settings
from django_delayqueue.management.logs import BATCH_LEVELS, configure_logging

logger = logging.getLogger(__name__)

# These commands print their own summary: the library's INFO lines start at --verbosity 2.


def add_spark_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default: $SPARK_MASTER, then local[*])",
    )


def add_redis_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--redis-url",
        default=None,
        help="Redis URL the Spark executors connect to (default: DELAYQUEUE['REDIS_URL'])",
    )


def effective_master(master: str | None) -> str:
    """The master a command will use: ``--master``, then ``$SPARK_MASTER``, then local."""
    return master or os.environ.get("SPARK_MASTER") or "local[*]"


def on_cluster(master: str | None) -> bool:
    """Whether executors may run on other hosts (any master but ``local[...]``)."""
    m = effective_master(master)
    return not (m == "local" or m.startswith("local["))


def require_shared_path(master: str | None, option: str, path: str) -> None:
    """A plain path on a cluster: say it must be storage every executor and the driver share."""
    if on_cluster(master) and not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path):
        logger.warning(
            "%s %s is a path on each host's own disk: on a cluster it must be storage the "
            "driver and every executor share (a shared mount), or a URI such as hdfs:// or "
            "s3a://",
            option,
            path,
        )


def spark_session(app_name: str, master: str | None, verbosity: int = 1) -> Any:
    """The SparkSession for a command, or a CommandError saying what to install."""
    configure_logging(verbosity, BATCH_LEVELS)
    try:
        from django_delayqueue.spark.session import get_spark
    except ImportError as e:
        raise CommandError(
            f"this command needs the spark extra: pip install 'django-delayqueue[spark]' ({e})"
        ) from e
    try:
        return get_spark(app_name, master)
    except Exception as e:  # Java missing or too old: pyspark raises a bare RuntimeError
        raise CommandError(f"could not start Spark (is Java 17+ installed?): {e}") from e


def redis_url(explicit: str | None = None, cluster: bool = False) -> str:
    """A URL the executors can open: ``--redis-url``, ``REDIS_URL``, or the cache's LOCATION.

    On a cluster (``cluster``) the executors resolve it on their own hosts: the built-in
    default (this host's 127.0.0.1:6379) is refused, and any other loopback address is warned
    about.
    """
    url = _configured_redis_url(explicit)
    if url is None:
        if cluster:
            raise CommandError(
                f"no Redis URL configured: on a cluster the executors would use their own "
                f"{DEFAULT_REDIS_URL}; pass --redis-url with an address they can reach"
            )
        return DEFAULT_REDIS_URL
    host = urlsplit(url).hostname or ""
    if cluster and (host in ("localhost", "::1") or host.startswith("127.")):
        logger.warning(
            "Redis URL %s is a loopback address: executors on other hosts reach their own",
            url,
        )
    return url


def _configured_redis_url(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    configured = dq_settings.REDIS_URL
    if isinstance(configured, (list, tuple)) and configured:  # a cluster's start nodes
        configured = configured[0]
    if configured:
        return str(configured)
    alias = dq_settings.CACHE_ALIAS
    if alias:
        location = settings.CACHES.get(alias, {}).get("LOCATION")
        if isinstance(location, (list, tuple)):
            location = location[0] if location else None
        if isinstance(location, str) and location.startswith(("redis://", "rediss://", "unix://")):
            return location
        raise CommandError(f"cannot tell the Redis URL of cache {alias!r}: pass --redis-url")
    return None


def split_columns(value: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in (value or "").split(",") if c.strip())
