from __future__ import annotations

import logging

from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "django_delayqueue"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from django_delayqueue import checks
        from django_delayqueue.mirror.kinds import MIRRORS

        checks.register_checks()
        for mirror in MIRRORS:  # the settings file -> rows -> Redis, at migrate and on save
            mirror.connect(self)
        # A delivery's handler errors are logged once, by the worker (see _handled_elsewhere).
        logging.getLogger("django.dispatch").addFilter(_handled_elsewhere)
        # Each installed app's handlers.py registers its receivers on the queue signals.
        autodiscover_modules("handlers")


def _handled_elsewhere(record: logging.LogRecord) -> bool:
    """Keep a django.dispatch record unless the worker logs it: Retry and Reject are how
    handlers steer a delivery (not errors), and other errors of a delivery are logged by
    ``Worker.handle`` with the queue, message id and attempt."""
    from django_delayqueue.core.errors import Reject, Retry
    from django_delayqueue.worker import dispatching

    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, (Retry, Reject)) or getattr(dispatching, "active", False))
