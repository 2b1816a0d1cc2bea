"""Settings of the demo shop (``make demo``, demo_project/run_demo.py).

The shop (demo_project/shop) closes unpaid orders and texts new stores; the demo's world around
it (demo_project/traffic) has an SMS gateway with limits, a partner that is sometimes down, a
sales report every minute, an export task and a generator of customers. The test suite runs on
settings of its own (tests/settings.py), so these can change with what the demo shows.

Redis comes from ``$REDIS_URL`` (run_demo.py sets it: a server on 6379, else an embedded one).
"""

import os
from pathlib import Path
from typing import Any

import django

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
    "demo_project.traffic",
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

SQLITE_OPTIONS: dict[str, Any] = {"timeout": 20}
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DB", BASE_DIR / "db.sqlite3"),
        # runserver, two consumer processes and the traffic generator write to one file:
        # wait for a lock rather than fail at once (run_demo.py also turns on WAL).
        "OPTIONS": SQLITE_OPTIONS,
    }
}
if django.VERSION >= (5, 1):
    # A transaction that reads then writes (paying an order) takes the write lock as it
    # begins: a deferred one fails with "database is locked" when it upgrades under WAL,
    # without waiting for the timeout.
    SQLITE_OPTIONS["transaction_mode"] = "IMMEDIATE"

# The demo's admin logs in as admin / admin, which the validators would reject.
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The demo's timings, in seconds: short, so that every queue has done something within a minute.
ORDER_CLOSE_DELAY = float(os.environ.get("ORDER_CLOSE_DELAY", "20"))
ACTIVATION_SMS_DELAY = float(os.environ.get("ACTIVATION_SMS_DELAY", "10"))
REPORT_EVERY = int(os.environ.get("DEMO_REPORT_EVERY", "60"))  # the sales report's schedule

# Start lateness above this (p99 over 5 minutes) is flagged in the admin: a laptop that runs the
# shop, two consumers and the generator stays well under it.
_WATCHED = {"lateness_warning_ms": 250}
DELAYQUEUE: dict[str, Any] = {
    "REDIS_URL": REDIS_URL,
    "PREFIX": "dq",
    "QUEUES": {
        # Four handlers a process: one waiting on SQLite's lock does not hold the next start.
        "order-close": {**_WATCHED, "max_attempts": 5, "concurrency": 4},
        # The SMS gateway (traffic/gateway.py) takes 5 messages a second for the account and
        # one at a time per phone number (each SMS has its phone as its key), and sometimes
        # hangs: the time limit stops the handler and the SMS is retried.
        "activation-sms": {
            **_WATCHED,
            "max_attempts": 3,
            "backoff_base": 2.0,
            "concurrency": 4,
            "rate_limit": "5/s",
            "key_concurrency": 1,
            "time_limit": 3,
            "visibility_timeout": 10,
        },
        # The partner is told of each paid order (traffic/partner.py); it is down now and then,
        # times out, or refuses an order: retried with backoff, then dead letters with reasons.
        "partner-callback": {
            **_WATCHED,
            "max_attempts": 3,
            "backoff_base": 2.0,
            "backoff_max": 8,
            "concurrency": 4,
        },
        "shop-reports": {**_WATCHED, "max_attempts": 3},
        # Django's Tasks framework (traffic/tasks.py, shop/tasks.py): the backend below.
        "shop-tasks": {**_WATCHED, "max_attempts": 3, "backoff_base": 0.2, "backoff_max": 2},
    },
    # Kept by runqueue itself: a tick every REPORT_EVERY seconds, no beat process.
    "SCHEDULES": {"sales-report": {"queue": "shop-reports", "every": REPORT_EVERY}},
}
TASKS = {
    "default": {
        "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
        "QUEUES": ["shop-tasks"],
        "OPTIONS": {"ON_COMMIT": True, "RESULT_TTL": 7 * 24 * 3600},
    }
}

# The SMS backend (shop/sms.py): the demo's fake gateway, which also records what it "sent".
SHOP_SMS_BACKEND = os.environ.get("SHOP_SMS_BACKEND", "demo_project.traffic.gateway.FakeGateway")
# Every how many calls the fake gateway hangs (0: never).
GATEWAY_HANG_EVERY = int(os.environ.get("DEMO_GATEWAY_HANG_EVERY", "9"))
# The export task (traffic/tasks.py) writes its CSV files here, and pauses this long between
# its 20 steps, so that its progress can be watched in the admin.
EXPORT_DIR = os.environ.get("DEMO_EXPORT_DIR", BASE_DIR / "exports")
EXPORT_STEP_SECONDS = float(os.environ.get("DEMO_EXPORT_STEP_SECONDS", "0.3"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # The handlers' failures the demo makes on purpose (a hung gateway, a partner that is down)
    # in one line each, without their tracebacks.
    # runserver's line for each refresh of the shop's timeline is left out too.
    "filters": {
        "one_line": {"()": "demo_project.traffic.log_filters.OneLineHandlerFailures"},
        "no_timeline": {"()": "demo_project.traffic.log_filters.NoTimelineRequests"},
    },
    "formatters": {
        "django.server": {
            "()": "django.utils.log.ServerFormatter",
            "format": "[{server_time}] {message}",
            "style": "{",
        }
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "filters": ["one_line"]},
        "django.server": {
            "class": "logging.StreamHandler",
            "formatter": "django.server",
            "filters": ["no_timeline"],
        },
    },
    "loggers": {
        "django_delayqueue": {"handlers": ["console"], "level": "INFO"},
        "demo_project": {"handlers": ["console"], "level": "INFO"},
        "django.server": {"handlers": ["django.server"], "level": "INFO", "propagate": False},
    },
}
