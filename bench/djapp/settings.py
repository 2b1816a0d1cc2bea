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
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
QUEUE = "bench-e2e"
DELAYQUEUE = {
    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "QUEUES": {QUEUE: {}},
}
