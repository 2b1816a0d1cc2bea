"""Django settings for ``runqueue`` fault drills: the test settings (tests/settings.py) plus
``drill_app``.

Everything that varies comes from the environment set by the test (Redis URL, ledger, the
drill queue's timeouts); the database is a file that is never migrated (the worker logs that
the settings rows could not be synced and goes on), except in the outbox drill, which migrates
it or a PostgreSQL database it creates (``$DRILL_PG_NAME``). Queues "drill2" and "drill3" (same
receiver, other settings) let one ``runqueue`` serve several drill queues at once, and
"drill-async" has an ``async def`` receiver; ``$DRILL_QUEUES`` (JSON, queue name -> settings)
overrides any drill queue's settings, or adds a queue (with "drill"'s settings under its own);
``$DRILL_RECEIVE`` (a JSON list) names the added queues that get the drill's ledger-keeping
receiver. ``$DRILL_CLUSTER=1`` connects to a Redis Cluster that ``REDIS_URL`` names a node of;
``$DRILL_CACHE_ALIAS=1`` through a django-redis cache alias on ``REDIS_URL``.
"""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import DELAYQUEUE, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "drill_app"]
DATABASES = {
    # A wait for a lock rather than "database is locked" at once: several processes (runqueues,
    # the outbox drill's producer) share the file.
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["DRILL_DB"],
        "OPTIONS": {"timeout": 30},
    },
}
if os.environ.get("DRILL_PG_NAME"):  # the outbox drill on PostgreSQL (tests/outbox_drill.py)
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["DRILL_PG_NAME"],
        "HOST": os.environ.get("DRILL_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DRILL_PG_PORT", "5432"),
        "USER": os.environ.get("DRILL_PG_USER", "postgres"),
    }
DELAYQUEUE = {
    **DELAYQUEUE,
    "REDIS_URL": os.environ["REDIS_URL"],
    "OUTBOX_RELAY_SECONDS": float(os.environ.get("DRILL_RELAY_SECONDS", "1")),
    # How long a killed committer's outbox rows wait for a relay (the atomic chaos drill).
    "OUTBOX_LEASE_SECONDS": float(os.environ.get("DRILL_OUTBOX_LEASE", "30")),
    # The Sentinel drill (tests/drills/test_faults_sentinel.py): the sentinels, and replica acks.
    "SENTINEL": json.loads(os.environ.get("DRILL_SENTINEL", "null")),
    "MIN_REPLICAS": int(os.environ.get("DRILL_MIN_REPLICAS", "0")),
    "SCHEDULES": json.loads(os.environ.get("DRILL_SCHEDULES", "{}")),
    "MIN_REPLICAS_TIMEOUT_SECONDS": 0.5,
    # The cluster drill (tests/drills/test_faults_cluster.py): REDIS_URL names one node.
    "CLUSTER": os.environ.get("DRILL_CLUSTER") == "1",
    "QUEUES": {
        **DELAYQUEUE["QUEUES"],
        "drill": {
            "visibility_timeout": float(os.environ.get("DRILL_VISIBILITY", "2")),
            "max_attempts": int(os.environ.get("DRILL_MAX_ATTEMPTS", "3")),
            "backoff_base": 0.05,
            "backoff_max": 0.5,
            "concurrency": int(os.environ.get("DRILL_CONCURRENCY", "2")),
            "claim_batch": int(os.environ.get("DRILL_CLAIM_BATCH", "10")),
        },
        "drill2": {
            "visibility_timeout": 1,
            "max_attempts": 2,
            "backoff_base": 0.02,
            "backoff_max": 0.2,
            "concurrency": 3,
            "claim_batch": 1,
        },
        "drill3": {
            "visibility_timeout": 2,
            "max_attempts": 4,
            "backoff_base": 0.1,
            "backoff_max": 1.0,
            "concurrency": 1,
            "claim_batch": 5,
        },
        # An async def receiver that awaits its action in a thread (drill_app/handlers.py).
        "drill-async": {
            "visibility_timeout": 2,
            "max_attempts": 3,
            "backoff_base": 0.05,
            "backoff_max": 0.5,
            "concurrency": 2,
        },
    },
}
if os.environ.get("DRILL_CACHE_ALIAS"):  # the connection of a django-redis cache alias
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "queues": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": os.environ["REDIS_URL"]},
    }
    DELAYQUEUE["CACHE_ALIAS"] = "queues"
    del DELAYQUEUE["REDIS_URL"]
# A runqueue pinned to an older envelope format (the upgrade drill): set only when asked, so
# that a release before envelope formats, which has no such setting, starts as well.
if os.environ.get("DRILL_ENVELOPE_FORMAT"):
    DELAYQUEUE["ENVELOPE_FORMAT"] = int(os.environ["DRILL_ENVELOPE_FORMAT"])
for _name, _overrides in json.loads(os.environ.get("DRILL_QUEUES", "{}")).items():
    _base = DELAYQUEUE["QUEUES"].get(_name, DELAYQUEUE["QUEUES"]["drill"])
    DELAYQUEUE["QUEUES"][_name] = {**_base, **_overrides}
# The atomic drill (tests/drills/test_inbox_drill.py): these queues (a JSON list) are atomic on
# the default database, with drill_app/atomic.py's receiver.
for _name in json.loads(os.environ.get("DRILL_ATOMIC", "[]")):
    _base = DELAYQUEUE["QUEUES"].get(_name, DELAYQUEUE["QUEUES"]["drill"])
    DELAYQUEUE["QUEUES"][_name] = {**_base, "atomic": True}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_delayqueue": {"handlers": ["console"], "level": "INFO"}},
}
