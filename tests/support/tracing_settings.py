"""Django settings of the tracing tests' ``runqueue`` child: the test settings plus
``tracing_app`` (receivers, and an OpenTelemetry SDK writing spans to ``$TRACING_SPANS``), its
traced queues and a Tasks backend on one of them. ``TRACED_QUEUES`` and ``TRACED_TASKS`` are
what the test process overrides its own settings with, so both sides agree."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DELAYQUEUE, INSTALLED_APPS

# A failed attempt waits an hour: one burst run delivers each message once.
_ONCE = {"max_attempts": 3, "backoff_base": 3600, "backoff_max": 3600}
TRACED_QUEUES = {"traced": _ONCE, "traced-async": _ONCE, "traced-tasks": _ONCE}
TRACED_TASKS = {
    "default": {
        "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
        "QUEUES": ["traced-tasks"],
        "OPTIONS": {"ON_COMMIT": False},
    }
}

INSTALLED_APPS = [*INSTALLED_APPS, "tracing_app"]
DELAYQUEUE = {
    **DELAYQUEUE,
    "REDIS_URL": os.environ["REDIS_URL"],
    "QUEUES": {**DELAYQUEUE["QUEUES"], **TRACED_QUEUES},
    "OTEL_PARENT": os.environ.get("TRACING_PARENT", "link"),
}
TASKS = TRACED_TASKS
