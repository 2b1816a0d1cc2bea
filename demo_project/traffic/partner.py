"""The demo's partner: told of each paid order by a message on ``partner-callback``.

Like a partner API it is not always there. It is down for 20 seconds of every 90 (503: the
callback is retried with backoff, and one that runs out of attempts meanwhile is a dead
letter: requeue it from the admin once the partner is back), it does not answer one call in
ten (retried), and it refuses orders above its limit (422: ``dq.Reject``, a dead letter at
once, with the partner's words as the reason).
"""

from __future__ import annotations

import logging
import time
import zlib
from decimal import Decimal
from typing import Any

import django_delayqueue as dq

logger = logging.getLogger(__name__)

QUEUE = "partner-callback"
CALLBACK_DELAY = 1.0  # seconds after the payment
OUTAGE_EVERY = 90  # seconds: the partner is down for the first OUTAGE_SECONDS of each period
OUTAGE_SECONDS = 20
AMOUNT_LIMIT = Decimal("90.00")


class PartnerDown(Exception):
    """The partner answered 503."""


class PartnerTimeout(Exception):
    """The partner did not answer in time."""


def callback_id(order_id: int) -> str:
    return f"paid-{order_id}"


def schedule_callback(sender: Any, order: Any, **kwargs: Any) -> None:
    """Receiver of the shop's ``order_paid``: tell the partner, once the payment commits."""
    dq.schedule(
        QUEUE,
        {"order_id": order.pk, "amount": str(order.amount)},
        delay=CALLBACK_DELAY,
        id=callback_id(order.pk),
    )


def partner_is_down(now: float) -> bool:
    return now % OUTAGE_EVERY < OUTAGE_SECONDS


def notify(order_id: int, amount: Decimal, attempt: int, now: float | None = None) -> None:
    """Call the partner's API for a paid order; raise as the partner answers."""
    if amount > AMOUNT_LIMIT:
        raise dq.Reject(f"422 from the partner: amounts above {AMOUNT_LIMIT} need a manual review")
    if partner_is_down(time.time() if now is None else now):
        raise PartnerDown("503 Service Unavailable")
    if zlib.crc32(f"{order_id}:{attempt}".encode()) % 10 == 0:
        raise PartnerTimeout("no answer within 2 s")
    time.sleep(0.02)  # the call itself
    logger.info("partner told of order %s (%s)", order_id, amount)
