from __future__ import annotations

import logging

from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "django_delayqueue"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_migrate, post_save
        from django.utils.module_loading import autodiscover_modules

        from django_delayqueue import checks
        from django_delayqueue.conf import sync
        from django_delayqueue.models import QueueConfig, RecurringSchedule
        from django_delayqueue.recurring import sync as recurring

        checks.register_checks()
        post_migrate.connect(sync.sync_after_migrate, sender=self, dispatch_uid="dq-sync")
        post_save.connect(sync.on_config_saved, sender=QueueConfig, dispatch_uid="dq-publish")
        post_migrate.connect(recurring.sync_after_migrate, sender=self, dispatch_uid="dq-rsync")
        for signal in (post_save, post_delete):
            signal.connect(
                recurring.on_schedule_changed, sender=RecurringSchedule, dispatch_uid="dq-rpub"
            )
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
