"""Settings of the benchmark's Django project (``DJANGO_SETTINGS_MODULE=bench.djapp.settings``).

The Redis URL and the SQLite file come from the environment the bench sets for its children.
"""

import os

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_delayqueue",
    "bench.djapp",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "bench.djapp.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BENCH_DB", ":memory:"),
    }
}
if os.environ.get("BENCH_PG_NAME"):  # bench/outbox_cost.py on the local PostgreSQL
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["BENCH_PG_NAME"],
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "USER": "postgres",
    }
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
QUEUE = "bench-e2e"
DELAYQUEUE = {
    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "QUEUES": {QUEUE: {}},
}

# bench/tasks_path.py: Django's Tasks framework on this app (BENCH_TASKS=delayqueue) or on the
# peer django-tasks-redis (BENCH_TASKS=redis, Django 6 + Python 3.12 only), and a signal queue
# doing the same work for the signal path beside them.
TASK_QUEUE = "bench-tasks"
SIGNAL_QUEUE = "bench-signal"
DELAYQUEUE["QUEUES"][TASK_QUEUE] = {"claim_batch": 200}
DELAYQUEUE["QUEUES"][SIGNAL_QUEUE] = {"claim_batch": 200}
# bench/processes.py: a handler that burns 20 ms of CPU per message (one thread per process).
CPU_QUEUE = "bench-cpu"
DELAYQUEUE["QUEUES"][CPU_QUEUE] = {"concurrency": 1, "claim_batch": 1}
# bench/claim_ahead.py: the same handler as a user configures it (the default claim_batch).
CPU_DEFAULT_QUEUE = "bench-cpu-default"
DELAYQUEUE["QUEUES"][CPU_DEFAULT_QUEUE] = {"concurrency": 1}
# bench/async_handlers.py: handlers that each wait a second, 500 at once.
DELAYQUEUE["QUEUES"]["bench-async-sleep"] = {"concurrency": 500, "claim_batch": 500}
DELAYQUEUE["QUEUES"]["bench-sync-sleep"] = {"concurrency": 500, "claim_batch": 500}
_TASKS_BACKEND = os.environ.get("BENCH_TASKS")
if _TASKS_BACKEND == "delayqueue":
    TASKS = {
        "default": {
            "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
            "QUEUES": [TASK_QUEUE],
            "OPTIONS": {"ON_COMMIT": False},
        }
    }
elif _TASKS_BACKEND == "redis":
    INSTALLED_APPS.append("django_tasks_redis")
    TASKS = {
        "default": {
            "BACKEND": "django_tasks_redis.RedisTaskBackend",
            "QUEUES": [TASK_QUEUE],
            "OPTIONS": {"REDIS_URL": DELAYQUEUE["REDIS_URL"], "REDIS_BLOCK_TIMEOUT": 1000},
        }
    }

# bench/hung_limits.py: a queue whose handler hangs (time_limit 2 s) beside a fast queue.
HUNG_QUEUE = "bench-hung"
FAST_QUEUE = "bench-fast"
DELAYQUEUE["QUEUES"][HUNG_QUEUE] = {
    "time_limit": 2,
    "visibility_timeout": 30,
    "concurrency": 1,
    "max_attempts": 1,
}
DELAYQUEUE["QUEUES"][FAST_QUEUE] = {"concurrency": 4}

# bench/rate_limit.py: three runqueue processes sharing one queue's rate limit (issue 27).
RATE_QUEUE = "bench-rate"
DELAYQUEUE["QUEUES"][RATE_QUEUE] = {
    "rate_limit": os.environ.get("BENCH_RATE_LIMIT", "50/s"),
    "concurrency": 4,
}
