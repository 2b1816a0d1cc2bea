"""django_delayqueue.api: schedule (on commit), cancel, get_queue, and the package's names."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import override_settings

import django_delayqueue as dq
from django_delayqueue.core import ConfigurationError, PayloadError, QueueKeys, RedisUnavailable
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.embedded import free_port

KEYS = QueueKeys("dq", "order-close")
ROOT = Path(__file__).resolve().parents[2]


def waiting(client: redis.Redis) -> set[bytes]:
    """Ids in pending or ready."""
    return set(client.zrange(KEYS.pending, 0, -1)) | set(client.lrange(KEYS.ready, 0, -1))


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_schedule_with_a_delay_returns_the_id(redis_client: redis.Redis) -> None:
    before = now_ms(redis_client)
    message_id = dq.schedule("order-close", {"order_id": 42}, delay=1800, on_commit=False)
    assert isinstance(message_id, str) and message_id
    due = redis_client.zscore(KEYS.pending, message_id)
    # Never early: at least 30 min after the server time read before the call. Above the time
    # read after it by at most a rounding up and the clock's round-trip uncertainty.
    assert due is not None and before + 1_800_000 <= due <= now_ms(redis_client) + 1_801_000
    assert decode_envelope(redis_client.hget(KEYS.messages, message_id))[2] == {"order_id": 42}


def test_schedule_accepts_timedelta_and_aware_datetime(redis_client: redis.Redis) -> None:
    a = dq.schedule("order-close", {}, delay=timedelta(minutes=30), on_commit=False)
    at = datetime(2100, 1, 1, tzinfo=timezone.utc)
    b = dq.schedule("order-close", {}, at=at, on_commit=False)
    assert redis_client.zscore(KEYS.pending, a) > now_ms(redis_client) + 1_700_000
    assert redis_client.zscore(KEYS.pending, b) == at.timestamp() * 1000


def test_no_delay_means_ready_now(redis_client: redis.Redis) -> None:
    message_id = dq.schedule("order-close", {"n": 1}, on_commit=False)
    assert redis_client.lrange(KEYS.ready, 0, -1) == [message_id.encode()]


def test_schedule_is_idempotent_on_id(redis_client: redis.Redis) -> None:
    first = dq.schedule("order-close", {"v": 1}, delay=60, id="order-42", on_commit=False)
    second = dq.schedule("order-close", {"v": 2}, delay=60, id="order-42", on_commit=False)
    assert first == second == "order-42"
    assert redis_client.zcard(KEYS.pending) == 1
    assert decode_envelope(redis_client.hget(KEYS.messages, "order-42"))[2] == {"v": 1}


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_message_is_sent_on_commit(redis_client: redis.Redis) -> None:
    with transaction.atomic():
        message_id = dq.schedule("order-close", {"order_id": 1}, delay=60)
        assert waiting(redis_client) == set()  # the id is known, the message not sent yet
    assert waiting(redis_client) == {message_id.encode()}


@pytest.mark.django_db(transaction=True)
def test_rollback_schedules_nothing(redis_client: redis.Redis) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        dq.schedule("order-close", {"order_id": 1}, delay=60)
        raise RuntimeError("the order failed")
    assert redis_client.hlen(KEYS.messages) == 0


@pytest.mark.django_db(transaction=True)
def test_on_commit_false_sends_at_once_even_in_a_transaction(redis_client: redis.Redis) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        message_id = dq.schedule("order-close", {}, delay=60, on_commit=False)
        assert waiting(redis_client) == {message_id.encode()}
        raise RuntimeError


@pytest.mark.django_db(transaction=True)
def test_on_commit_default_comes_from_settings(redis_client: redis.Redis) -> None:
    with (
        override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "ON_COMMIT": False}),
        transaction.atomic(),
    ):
        message_id = dq.schedule("order-close", {}, delay=60)
        assert waiting(redis_client) == {message_id.encode()}


def test_capture_on_commit_callbacks_runs_the_send(
    redis_client: redis.Redis, django_capture_on_commit_callbacks: Any, db: None
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        message_id = dq.schedule("order-close", {}, delay=60)
    assert len(callbacks) == 1
    assert waiting(redis_client) == {message_id.encode()}


# --- Redis down when the message is sent ---------------------------------------------------------


def redis_down(**extra: Any) -> Any:
    """Settings whose Redis refuses connections (a port nothing listens on): really unreachable.

    Without the outbox unless ``OUTBOX=True``: what a send after a commit does when nothing
    keeps the message (tests/app/test_outbox.py covers the outbox).
    """
    url = f"redis://127.0.0.1:{free_port()}/0"
    changed = {"REDIS_URL": url, "OUTBOX": False, **extra}
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, **changed})


def lost_message_logs(caplog: pytest.LogCaptureFixture, message_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
        and r.name == "django_delayqueue.api"
        and message_id in r.getMessage()
    ]


@pytest.mark.django_db(transaction=True)
def test_a_send_after_commit_that_finds_redis_down_is_logged_and_later_callbacks_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later: list[str] = []
    with redis_down(), transaction.atomic():
        message_id = dq.schedule("order-close", {"order_id": 42}, delay=60, id="close-42")
        transaction.on_commit(lambda: later.append("ran"))
    # Before: RedisUnavailable escaped the commit (already done) and skipped this callback.
    assert later == ["ran"]
    (logged,) = lost_message_logs(caplog, message_id)
    assert "order-close" in logged and '{"order_id":42}' in logged
    assert "due" in logged and "not sent" in logged


def test_a_captured_commit_that_finds_redis_down_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any, db: None
) -> None:
    with redis_down(), django_capture_on_commit_callbacks(execute=True) as callbacks:
        message_id = dq.schedule("order-close", {"order_id": 7}, delay=60)
    assert len(callbacks) == 1
    assert len(lost_message_logs(caplog, message_id)) == 1


@pytest.mark.parametrize("on_commit", [True, False])
@pytest.mark.django_db(transaction=True)
def test_a_send_in_the_callers_frame_that_finds_redis_down_raises(
    caplog: pytest.LogCaptureFixture, on_commit: bool
) -> None:
    # No transaction (on_commit sends at once) or on_commit=False: the caller sees the error.
    with redis_down(), pytest.raises(RedisUnavailable):
        dq.schedule("order-close", {"order_id": 1}, delay=60, id="now", on_commit=on_commit)
    assert lost_message_logs(caplog, "now") == []
    with redis_down(), transaction.atomic(), pytest.raises(RedisUnavailable):
        dq.schedule("order-close", {"order_id": 1}, delay=60, id="now", on_commit=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"payload": object()}, "not JSON"),
        ({"payload": {}, "delay": -1}, "delay"),
        ({"payload": {}, "at": datetime(2100, 1, 1)}, "timezone-aware"),
        ({"payload": {}, "id": ""}, "non-empty"),
        ({"payload": {}, "delay": 1, "at": datetime.now(timezone.utc)}, "not both"),
        ({"payload": {}, "delay": True}, "not True \\(bool\\)"),
        ({"payload": {}, "delay": "5"}, "not '5' \\(str\\)"),
        ({"payload": {"name": "r\udcffport.pdf"}}, "lone surrogate"),
        ({"payload": json.loads("[" * 201 + "]" * 201)}, "more than 200 levels deep"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_bad_messages_raise_at_the_call_not_at_commit(
    redis_client: redis.Redis, kwargs: dict[str, Any], match: str
) -> None:
    with transaction.atomic(), pytest.raises(PayloadError, match=match):
        dq.schedule("order-close", **kwargs)
    assert redis_client.hlen(KEYS.messages) == 0


def test_payload_over_the_queue_limit_is_refused(redis_client: redis.Redis) -> None:
    config = {**settings.DELAYQUEUE, "QUEUES": {"small": {"max_payload_bytes": 10}}}
    with override_settings(DELAYQUEUE=config), pytest.raises(PayloadError, match="over the"):
        dq.schedule("small", {"text": "x" * 100}, on_commit=False)


def test_unknown_queue(redis_client: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="unknown queue 'nope'; configured: order-close"):
        dq.schedule("nope", {})
    with pytest.raises(ConfigurationError):
        dq.cancel("nope", "x")
    with pytest.raises(ConfigurationError):
        dq.get_queue("nope")


def test_a_queue_name_with_the_prefix_separator_is_refused_and_nothing_is_stored(
    redis_client: redis.Redis,
) -> None:
    config = {**settings.DELAYQUEUE, "PREFIX": "shop", "QUEUES": {"eu:orders": {}}}
    refused = pytest.raises(ConfigurationError, match="a queue name cannot hold it")
    with override_settings(DELAYQUEUE=config), refused:
        dq.schedule("eu:orders", {"order": 1}, on_commit=False)
    assert redis_client.keys("*") == []


def test_cancel_is_true_only_while_waiting(redis_client: redis.Redis) -> None:
    dq.schedule("order-close", {}, delay=60, id="order-7", on_commit=False)
    assert dq.cancel("order-close", "order-7") is True
    assert dq.cancel("order-close", "order-7") is False
    assert redis_client.hlen(KEYS.messages) == 0


def test_get_queue_is_cached_and_counts(redis_client: redis.Redis) -> None:
    q = dq.get_queue("order-close")
    assert dq.get_queue("order-close") is q
    assert q.keys.prefix == "dq"
    dq.schedule("order-close", {}, delay=60, on_commit=False)
    dq.schedule("order-close", {}, on_commit=False)
    assert q.counts() == {"pending": 1, "ready": 1, "unack": 0, "retry": 0, "garbage": 0}


def test_get_queue_follows_prefix_changes(redis_client: redis.Redis) -> None:
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "PREFIX": "shop"}):
        assert dq.get_queue("order-close").keys.tag == "{shop:order-close}"
    assert dq.get_queue("order-close").keys.tag == "{dq:order-close}"


def test_package_exports_the_public_names() -> None:
    for name in ("schedule", "cancel", "get_queue", "topic", "Retry", "Reject"):
        assert getattr(dq, name) is not None
    assert issubclass(dq.PayloadError, dq.DelayQueueError)
    assert dq.Message.__name__ == "Message"
    with pytest.raises(AttributeError):
        dq.nothing_here  # noqa: B018


def test_importing_the_package_does_not_import_django() -> None:
    code = (
        "import sys, django_delayqueue as dq, django_delayqueue.core\n"
        "assert dq.Retry(delay=2).delay == 2\n"
        "print('django' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
