"""What the Spark commands share: the optional-import guard, the Redis URL, the session.

Not a command (Django skips modules whose names start with an underscore). The commands
import pyspark only inside ``handle`` through :func:`spark_session`, so ``manage.py help``
and the rest of the app work without pyspark or Java.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from django_delayqueue.conf.settings import DEFAULT_REDIS_URL, dq_settings
from django_delayqueue.management.logs import BATCH_LEVELS, configure_logging

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


def redis_url(explicit: str | None = None) -> str:
    """A URL the executors can open: ``--redis-url``, ``REDIS_URL``, or the cache's LOCATION."""
    if explicit:
        return explicit
    if dq_settings.REDIS_URL:
        return str(dq_settings.REDIS_URL)
    alias = dq_settings.CACHE_ALIAS
    if alias:
        location = settings.CACHES.get(alias, {}).get("LOCATION")
        if isinstance(location, (list, tuple)):
            location = location[0] if location else None
        if isinstance(location, str) and location.startswith(("redis://", "rediss://", "unix://")):
            return location
        raise CommandError(f"cannot tell the Redis URL of cache {alias!r}: pass --redis-url")
    return DEFAULT_REDIS_URL


def split_columns(value: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in (value or "").split(",") if c.strip())
