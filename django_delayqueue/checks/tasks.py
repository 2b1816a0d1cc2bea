"""E005-E007 and E012: the checks of a TASKS backend of this app, when the framework's own
check does not run them."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """E005-E007 of every TASKS backend of this app, unless the framework's check runs them.

    ``django.tasks`` registers its check when it is first imported, and the ``django-tasks``
    backport when its app is installed: a project whose tasks module is not imported by
    ``manage.py check`` (or without ``django_tasks`` in INSTALLED_APPS) would not see them.
    """
    if not getattr(settings, "TASKS", None) or _framework_checks_registered():
        return []
    try:
        from django_delayqueue.tasks import framework
        from django_delayqueue.tasks.backend import DelayQueueBackend
    except ImportError:  # no Tasks framework installed: TASKS cannot name this backend
        return []
    found: list[Any] = []
    for alias in settings.TASKS:
        try:
            backend = framework.task_backends[alias]
        except Exception:  # the framework's own check reports a backend that cannot load
            continue
        if isinstance(backend, DelayQueueBackend):
            found += list(backend.check())
    return found


def _framework_checks_registered() -> bool:
    from django.core.checks import registry

    framework_checks = ("django.tasks.checks", "django_tasks.checks")
    registered = registry.registry.get_checks(include_deployment_checks=True)
    return any(getattr(check, "__module__", "") in framework_checks for check in registered)
