"""One ``setting_changed`` receiver that resets every cache the settings feed.

``override_settings(DELAYQUEUE=...)`` in a test (or anything else sending ``setting_changed``)
must reach all of them at once: the settings dict, the Redis client and clock, the published
queue settings (``mirror.queue_overrides``), the Queue objects built from them and the task
queues registered.
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed

from django_delayqueue.conf import connection, queues, task_registry
from django_delayqueue.conf.settings import SETTING_NAME, dq_settings
from django_delayqueue.mirror import queue_overrides


def reset_all() -> None:
    """Forget every cached value built from ``settings.DELAYQUEUE``."""
    dq_settings.reload()
    connection.reset()
    queue_overrides.forget()
    queues.reset()
    task_registry.forget()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING_NAME, "TASKS"):  # TASKS: which queues take tasks, and their settings
        reset_all()
    if setting == "TASKS":
        _forget_task_backends()


def _forget_task_backends() -> None:
    """The Tasks framework's backends built for the old TASKS (tasks.framework.forget_backends:
    the backport up to 0.8 forgets them only when listed in INSTALLED_APPS)."""
    try:
        from django_delayqueue.tasks import framework
    except ImportError:  # no Tasks framework installed: nothing was built
        return
    framework.forget_backends()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_delayqueue.conf.caches")
