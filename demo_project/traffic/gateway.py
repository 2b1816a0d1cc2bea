"""The demo's SMS gateway: a fake one with a real gateway's habits.

It takes a moment per message, accepts one message at a time per phone number (another one
while the first is being sent is refused, "429"), and now and then hangs: a connection that
never answers. The queue is configured for it (demo_project/settings.py, ``activation-sms``):
``rate_limit: "5/s"`` for the account, the phone as each SMS's flow key with
``key_concurrency: 1``, and a ``time_limit`` that stops a hung send, so that the SMS is retried.

What it "sent" is recorded in the shop's SentSms table. Its state (the lock per phone, the
count of calls) is kept in the queues' Redis, shared by every consumer process.
"""

from __future__ import annotations

import logging
import random
import time
import uuid

from django.conf import settings

from django_delayqueue.conf.connection import get_client
from django_delayqueue.core.envelope import to_str

logger = logging.getLogger(__name__)

CALLS_KEY = "demo:gateway:calls"
PHONE_LOCK = "demo:gateway:sending:{phone}"
HANG_SECONDS = 120.0  # how long a hung send lasts if nothing stops it


class GatewayBusy(Exception):
    """The gateway refused a second message to a phone that is being sent one."""


class FakeGateway:
    """An SMS backend (shop/sms.py) that behaves like a gateway: see the module's docstring."""

    def send(self, phone: str, text: str, *, kind: str = "", store_id: int | None = None) -> None:
        from demo_project.shop.models import SentSms

        client = get_client()
        call = int(client.incr(CALLS_KEY))
        lock, token = PHONE_LOCK.format(phone=phone), uuid.uuid4().hex
        if not client.set(lock, token, nx=True, px=int(HANG_SECONDS * 1000)):
            raise GatewayBusy(f"429: a message to {phone} is being sent already")
        try:
            hang_every = int(getattr(settings, "GATEWAY_HANG_EVERY", 0))
            if hang_every and call % hang_every == 0:
                logger.info("gateway: no answer to the SMS for %s (call %d)", phone, call)
                _hang()
            time.sleep(random.uniform(0.05, 0.2))  # the gateway's own latency
            SentSms.objects.create(phone=phone, text=text, kind=kind, store_id=store_id)
        finally:
            if to_str(client.get(lock) or "") == token:
                client.delete(lock)


def _hang() -> None:
    """A connection that never answers, in short sleeps: the queue's time limit raises
    TimeLimitExceeded at the next Python instruction (one blocked in C for the whole time
    could not be stopped but by replacing its process: docs/workers.md)."""
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.05)
