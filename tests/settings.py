"""Settings of the test suite: the demo project's apps with the queues the tests rely on.

The demo (``demo_project/settings.py``) grows with what it shows (``make demo``: a traffic
generator, rate-limited SMS, a flaky partner, recurring reports); the tests keep these settings,
so that a change to the demo never changes what a test sees. ``setup.cfg`` points pytest here;
child processes the tests start name it too (``DJANGO_SETTINGS_MODULE=tests.settings``, the
checkout on their path), and the drills' and tracing tests' settings start from it.

Redis comes from ``$REDIS_URL`` (tests/conftest.py points it at the session's private server).
The environment switches keep the names the tests have always set: ``DEMO_DB`` (a database
file of the test's own), ``DEMO_TASKS`` (the Tasks backend on), ``DEMO_SLOW_QUEUE`` (the slow
queues of the SIGTERM tests).
"""

import os
from pathlib import Path
from typing import Any

# The demo project's folder: a database file the tests do not name is its (as it always was).
BASE_DIR = Path(__file__).resolve().parent.parent / "demo_project"

# Tests only: never deploy these values.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-delayqueue-demo")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_delayqueue",
    "demo_project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
WSGI_APPLICATION = "demo_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DB", BASE_DIR / "db.sqlite3"),
    }
}

# The demo's admin logs in as admin / admin, which the validators would reject.
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DELAYQUEUE: dict[str, Any] = {
    "REDIS_URL": REDIS_URL,
    "PREFIX": "dq",
    "QUEUES": {
        "order-close": {"max_attempts": 5},
        "activation-sms": {"max_attempts": 3, "backoff_base": 5.0},
    },
}
# Django's Tasks framework (django.tasks on Django 6, the django-tasks backport before) on a
# delay queue of its own (demo_project/shop/tasks.py): turned on where a test tests it
# (tests/app/test_tasks_backend.py, DEMO_TASKS=1 for its child processes), so that the other
# tests see the two queues above.
TASK_QUEUE_SETTINGS = {"max_attempts": 3, "backoff_base": 0.2, "backoff_max": 2}
TASKS_SETTING = {
    "default": {
        "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
        "QUEUES": ["shop-tasks"],
        "OPTIONS": {"ON_COMMIT": True, "RESULT_TTL": 7 * 24 * 3600},
    }
}
if os.environ.get("DEMO_TASKS") == "1":
    DELAYQUEUE["QUEUES"]["shop-tasks"] = TASK_QUEUE_SETTINGS
    TASKS = TASKS_SETTING
if os.environ.get("DEMO_SLOW_QUEUE") == "1":
    # Only for the SIGTERM test (tests/app/test_runqueue.py): a queue whose handler sleeps.
    DELAYQUEUE["QUEUES"]["demo-slow"] = {"visibility_timeout": 60, "backoff_base": 0.1}
    # Its async twin (tests/app/test_runqueue_async.py): handlers on the event loop.
    DELAYQUEUE["QUEUES"]["demo-slow-async"] = {"visibility_timeout": 60, "concurrency": 10}
    DELAYQUEUE["SETTINGS_REFRESH_SECONDS"] = 0.5

# The shop's delays, in seconds (tests/app/test_shop.py overrides them where it waits).
ORDER_CLOSE_DELAY = float(os.environ.get("ORDER_CLOSE_DELAY", "30"))
ACTIVATION_SMS_DELAY = float(os.environ.get("ACTIVATION_SMS_DELAY", "45"))
# Dotted path of the SMS backend class (see shop/sms.py); the default records, never sends.
SHOP_SMS_BACKEND = os.environ.get("SHOP_SMS_BACKEND", "demo_project.shop.sms.DatabaseBackend")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_delayqueue": {"handlers": ["console"], "level": "INFO"},
        "demo_project": {"handlers": ["console"], "level": "INFO"},
    },
}
