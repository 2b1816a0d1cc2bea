from __future__ import annotations

import logging

from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "django_delayqueue"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate, post_save
        from django.utils.module_loading import autodiscover_modules

        from django_delayqueue import checks
        from django_delayqueue.conf import sync
        from django_delayqueue.models import QueueConfig

        checks.register_checks()
        post_migrate.connect(sync.sync_after_migrate, sender=self, dispatch_uid="dq-sync")
        post_save.connect(sync.on_config_saved, sender=QueueConfig, dispatch_uid="dq-publish")
        # Retry and Reject are how handlers steer a delivery, not errors of send_robust.
        logging.getLogger("django.dispatch").addFilter(_hide_handler_verdicts)
        # Each installed app's handlers.py registers its receivers on the queue signals.
        autodiscover_modules("handlers")


def _hide_handler_verdicts(record: logging.LogRecord) -> bool:
    from django_delayqueue.core.errors import Reject, Retry

    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, (Retry, Reject))
