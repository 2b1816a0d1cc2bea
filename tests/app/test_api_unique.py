"""dq.schedule(..., unique_for=): uniqueness windows through the API and the transactional outbox.

The core's rules (refused while open, after an ack or a cancel; a throttle with replace) are
tests/core/test_core_uniqueness.py's; here, that the window survives every way to Redis: sent at
once, on commit through an outbox row, and by the relay when Redis was down at the commit.
Windows are an hour long, so the real clock of the Django layer cannot close one mid-test.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import override_settings

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.embedded import free_port
from django_delayqueue.models import OutboxMessage
from django_delayqueue.outbox.relay import OutboxRelay

KEYS = QueueKeys("dq", "order-close")
HOUR = 3600
pytestmark = pytest.mark.django_db(transaction=True)


def redis_down() -> Any:
    url = f"redis://127.0.0.1:{free_port()}/0"
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "REDIS_URL": url, "OUTBOX": True})


def outbox_on() -> Any:
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "OUTBOX": True})


def payload(client: redis.Redis, message_id: str) -> Any:
    return decode_envelope(client.hget(KEYS.messages, message_id))[2]


def ack_everything() -> None:
    q = dq.get_queue("order-close")
    q.ack(*q.claim(100))


def test_a_second_schedule_in_the_window_is_refused_and_logged(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    dq.schedule("order-close", {"v": 1}, id="sms-7", unique_for=HOUR, on_commit=False)
    ack_everything()
    with caplog.at_level(logging.INFO, logger="django_delayqueue.api"):
        assert dq.schedule("order-close", {"v": 2}, id="sms-7", unique_for=HOUR) == "sms-7"
    assert "not scheduled sms-7 on order-close: its uniqueness window" in caplog.text
    assert redis_client.hexists(KEYS.messages, "sms-7") == 0  # nothing stored


def test_the_window_goes_through_the_outbox_row_and_opens_at_the_commit(
    redis_client: redis.Redis,
) -> None:
    with outbox_on(), transaction.atomic():
        dq.schedule("order-close", {"v": 1}, delay=60, id="sms-7", unique_for=HOUR)
        assert OutboxMessage.objects.get().unique_ms == HOUR * 1000
        assert redis_client.zscore(KEYS.unique, "sms-7") is None  # nothing before the commit
    assert OutboxMessage.objects.count() == 0
    assert redis_client.zscore(KEYS.unique, "sms-7") is not None
    assert dq.get_queue("order-close").cancel("sms-7") == 1
    with outbox_on(), transaction.atomic():  # cancelled: the window is still open
        dq.schedule("order-close", {"v": 2}, delay=60, id="sms-7", unique_for=HOUR)
    assert redis_client.hexists(KEYS.messages, "sms-7") == 0


def test_a_row_the_relay_sends_keeps_its_window(redis_client: redis.Redis) -> None:
    dq.schedule("order-close", {"v": 1}, id="sms-7", unique_for=HOUR, on_commit=False)
    ack_everything()
    with redis_down(), transaction.atomic():
        dq.schedule("order-close", {"v": 2}, id="sms-7", unique_for=HOUR)
        dq.schedule("order-close", {"v": 3}, id="sms-8", unique_for=HOUR)
    assert sorted(OutboxMessage.objects.values_list("unique_ms", flat=True)) == [HOUR * 1000] * 2
    with outbox_on():
        done = OutboxRelay().relay_once()
    assert (done.sent, done.failed) == (2, 0)
    assert redis_client.hexists(KEYS.messages, "sms-7") == 0  # refused by its window
    assert payload(redis_client, "sms-8") == {"v": 3}
    assert redis_client.zscore(KEYS.unique, "sms-8") is not None


def test_a_bad_window_raises_at_the_call_even_when_sending_on_commit() -> None:
    with outbox_on(), transaction.atomic():
        with pytest.raises(dq.PayloadError, match="unique_for needs an id"):
            dq.schedule("order-close", {"v": 1}, unique_for=HOUR)
        with pytest.raises(dq.PayloadError, match="more than 0 seconds"):
            dq.schedule("order-close", {"v": 1}, id="x", unique_for=-1)
        assert OutboxMessage.objects.count() == 0
