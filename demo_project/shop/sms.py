"""A small pluggable SMS backend, chosen by ``settings.SHOP_SMS_BACKEND`` (a dotted path).

The default records each message in :class:`~demo_project.shop.models.SentSms` instead of
sending it, so the demo (and the tests) can show what would have gone out.
"""

from __future__ import annotations

import logging
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

DEFAULT_BACKEND = "demo_project.shop.sms.DatabaseBackend"


class SmsBackend(Protocol):
    def send(self, phone: str, text: str, *, kind: str = "", store_id: int | None = None) -> None:
        """Send ``text`` to ``phone``; raise to have the delivery retried."""
        ...


class DatabaseBackend:
    """Records what it "sent" in the SentSms table."""

    def send(self, phone: str, text: str, *, kind: str = "", store_id: int | None = None) -> None:
        from .models import SentSms

        SentSms.objects.create(phone=phone, text=text, kind=kind, store_id=store_id)


class LoggingBackend:
    """Writes the message to the log only."""

    def send(self, phone: str, text: str, *, kind: str = "", store_id: int | None = None) -> None:
        logger.info("SMS to %s: %s", phone, text)


def get_backend() -> SmsBackend:
    return import_string(getattr(settings, "SHOP_SMS_BACKEND", DEFAULT_BACKEND))()


def send_sms(phone: str, text: str, *, kind: str = "", store_id: int | None = None) -> None:
    get_backend().send(phone, text, kind=kind, store_id=store_id)
