"""django_delayqueue.api: schedule(..., replace=True); a schedule creating nothing is logged."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

import django_delayqueue as dq
from django_delayqueue.core import QueueKeys
from django_delayqueue.core.envelope import decode_envelope

KEYS = QueueKeys("dq", "order-close")


def payload(client: redis.Redis, message_id: str) -> Any:
    return decode_envelope(client.hget(KEYS.messages, message_id))[2]


def test_replace_gives_a_waiting_message_the_new_payload_and_due_time(
    redis_client: redis.Redis,
) -> None:
    dq.schedule("order-close", {"v": 1}, delay=60, id="order-42", on_commit=False)
    due = redis_client.zscore(KEYS.pending, "order-42")
    message_id = dq.schedule(
        "order-close", {"v": 2}, delay=600, id="order-42", on_commit=False, replace=True
    )
    assert message_id == "order-42"
    assert payload(redis_client, "order-42") == {"v": 2}
    assert redis_client.zscore(KEYS.pending, "order-42") > due + 500_000
    assert redis_client.zcard(KEYS.pending) == 1


def test_a_schedule_that_creates_nothing_is_logged_with_the_state(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    dq.schedule("order-close", {"v": 1}, delay=60, id="order-42", on_commit=False)
    with caplog.at_level(logging.INFO, logger="django_delayqueue.api"):
        assert dq.schedule("order-close", {"v": 2}, id="order-42", on_commit=False) == "order-42"
    (record,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert "order-42" in record.getMessage() and "already pending" in record.getMessage()
    assert payload(redis_client, "order-42") == {"v": 1}


def test_a_send_on_commit_that_creates_nothing_is_logged_too(
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
    db: None,
) -> None:
    q = dq.get_queue("order-close")
    q.schedule({"v": 1}, id="order-7")
    (delivery,) = q.claim()
    with (
        caplog.at_level(logging.INFO, logger="django_delayqueue.api"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        dq.schedule("order-close", {"v": 2}, id="order-7")
    assert "already unack" in caplog.text
    q.ack(delivery)


def test_replace_of_a_message_in_flight_is_scheduled_by_its_ack(redis_client: redis.Redis) -> None:
    q = dq.get_queue("order-close")
    q.schedule({"run": 1}, id="report")
    (delivery,) = q.claim()
    dq.schedule("order-close", {"run": 2}, delay=60, id="report", on_commit=False, replace=True)
    assert payload(redis_client, "report") == {"run": 1}
    assert q.ack(delivery) == 1
    assert payload(redis_client, "report") == {"run": 2}
    assert redis_client.zscore(KEYS.pending, "report") is not None


def test_cancel_is_true_when_it_removes_a_successor(redis_client: redis.Redis) -> None:
    q = dq.get_queue("order-close")
    q.schedule({"run": 1}, id="report")
    (delivery,) = q.claim()
    dq.schedule("order-close", {"run": 2}, delay=60, id="report", on_commit=False, replace=True)
    assert dq.cancel("order-close", "report") is True
    assert dq.cancel("order-close", "report") is False
    assert q.ack(delivery) == 1
    assert redis_client.hlen(KEYS.messages) == 0
