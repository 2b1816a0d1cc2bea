"""Settings for the demo shop, which is also the test project.

Redis comes from ``$REDIS_URL`` so that ``make demo`` (run_demo.py) and the tests
(tests/conftest.py) can point it at a server of their own.
"""

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent

# Demo only: never deploy these values.
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
# delay queue of its own: shop/tasks.py. `make demo` turns it on; the test suite turns it on
# where it tests it (tests/app/test_tasks_backend.py), so other tests see the two queues above.
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

# The shop's delays, in seconds: short so the demo shows messages flowing within a minute.
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
