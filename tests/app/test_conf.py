"""django_delayqueue.conf: the DELAYQUEUE dict over defaults, and effective queue settings."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_delayqueue.conf.queues import queue_settings
from django_delayqueue.conf.settings import (
    dq_settings,
    file_queue_settings,
    queue_names,
    settings_problems,
)
from django_delayqueue.core import ConfigurationError, QueueKeys
from django_delayqueue.embedded import free_port
from django_delayqueue.mirror import queue_overrides


def delayqueue(**changes: Any) -> dict[str, Any]:
    """The test settings' DELAYQUEUE with ``changes`` (keeps the private REDIS_URL)."""
    return {**settings.DELAYQUEUE, **changes}


def test_defaults_fill_in_what_settings_leave_out() -> None:
    with override_settings(DELAYQUEUE={"REDIS_URL": settings.DELAYQUEUE["REDIS_URL"]}):
        assert dq_settings.PREFIX == "dq"
        assert dq_settings.ON_COMMIT is True
        assert dq_settings.JOURNAL_MAXLEN == 100_000
        assert dq_settings.CLOCK == "redis"
        assert dq_settings.SETTINGS_REFRESH_SECONDS == 2
        assert dq_settings.HEALTH_MAX_OVERDUE_SECONDS == 60
        assert queue_names() == []


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NOPE"):
        dq_settings.NOPE  # noqa: B018


def test_override_settings_reloads_the_cached_dict() -> None:
    assert dq_settings.PREFIX == "dq"
    with override_settings(DELAYQUEUE=delayqueue(PREFIX="shop")):
        assert dq_settings.PREFIX == "shop"
    assert dq_settings.PREFIX == "dq"


def test_queue_names_keep_settings_order() -> None:
    queues = {"b": {}, "a": {}, "c": None}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        assert queue_names() == ["b", "a", "c"]


def test_file_settings_merge_defaults_under_the_queue_dict() -> None:
    config = delayqueue(
        DEFAULTS={"max_attempts": 9, "backoff_base": 2.0},
        QUEUES={"a": {"max_attempts": 3, "time_limit": 10}, "b": None},
    )
    with override_settings(DELAYQUEUE=config):
        a, b = file_queue_settings("a"), file_queue_settings("b")
    assert (a.max_attempts, a.backoff_base, a.time_limit) == (3, 2.0, 10)
    assert (b.max_attempts, b.backoff_base, b.time_limit) == (9, 2.0, None)


def test_handler_time_limit_is_read_as_time_limit_with_a_deprecation_warning() -> None:
    config = delayqueue(
        DEFAULTS={"time_limit": 50},
        QUEUES={
            "old": {"handler_time_limit": 10},
            "both": {"handler_time_limit": 9, "time_limit": 8},
        },
    )
    with (
        override_settings(DELAYQUEUE=config),
        pytest.warns(DeprecationWarning, match="'handler_time_limit' is deprecated, rename it"),
    ):
        old, both = file_queue_settings("old"), file_queue_settings("both")
    assert old.time_limit == 10  # the queue's old key wins over the DEFAULTS' new one
    assert both.time_limit == 8  # where a dict has both, the new name wins


def test_time_limits_are_queue_settings() -> None:
    config = delayqueue(
        QUEUES={"a": {"soft_time_limit": 5, "time_limit": 9.5, "abort_grace_seconds": 0}}
    )
    with override_settings(DELAYQUEUE=config):
        a = file_queue_settings("a")
    assert (a.soft_time_limit, a.time_limit, a.abort_grace_seconds) == (5, 9.5, 0)
    with (
        override_settings(
            DELAYQUEUE=delayqueue(QUEUES={"a": {"time_limit": 5, "soft_time_limit": 6}})
        ),
        pytest.raises(ConfigurationError, match="time_limit must be greater than soft_time_limit"),
    ):
        file_queue_settings("a")


def test_invalid_queue_settings_name_the_queue() -> None:
    with (
        override_settings(DELAYQUEUE=delayqueue(QUEUES={"a": {"max_attempts": 0}})),
        pytest.raises(ConfigurationError, match=r"QUEUES'\]\['a'\].*max_attempts"),
    ):
        file_queue_settings("a")


def test_unknown_queue_lists_the_configured_ones() -> None:
    with pytest.raises(ConfigurationError, match="unknown queue 'nope'; configured: order-close"):
        file_queue_settings("nope")


def test_settings_problems_lists_types_then_ranges() -> None:
    assert settings_problems({"max_attempts": 3, "paused": True}) == []
    typed = settings_problems({"max_attempts": "5", "paused": 1, "claim_batch": 2.5})
    assert any("max_attempts must be a number" in p for p in typed)
    assert any("paused must be True or False" in p for p in typed)
    assert any("claim_batch must be a whole number" in p for p in typed)
    ranged = settings_problems({"max_attempts": 0, "visibility_timeout": 0.5})
    assert len(ranged) == 2


def test_queue_settings_apply_published_overrides(redis_client: redis.Redis) -> None:
    queue_overrides.forget()
    assert queue_settings("order-close").max_attempts == 5
    queue_overrides.publish({"order-close": {"max_attempts": 11, "paused": True}})
    effective = queue_settings("order-close")
    assert (effective.max_attempts, effective.paused) == (11, True)
    # Settings that are not mirrored come from the file still.
    assert effective.max_payload_bytes == file_queue_settings("order-close").max_payload_bytes


def test_queue_settings_read_redis_at_most_once_per_refresh(redis_client: redis.Redis) -> None:
    key = QueueKeys("dq", "order-close").config
    with override_settings(DELAYQUEUE=delayqueue(SETTINGS_REFRESH_SECONDS=3600)):
        assert queue_settings("order-close").max_attempts == 5
        redis_client.hset(key, "max_attempts", "7")  # another process published
        assert queue_settings("order-close").max_attempts == 5  # cached
        queue_overrides.forget(["order-close"])
        assert queue_settings("order-close").max_attempts == 7


def test_invalid_published_values_are_ignored(redis_client: redis.Redis) -> None:
    queue_overrides.forget()
    redis_client.hset(QueueKeys("dq", "order-close").config, "max_attempts", "0")
    assert queue_settings("order-close").max_attempts == 5


def test_queue_settings_fall_back_to_the_file_when_redis_is_down() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(DELAYQUEUE=delayqueue(REDIS_URL=dead)):
        assert queue_settings("activation-sms") == file_queue_settings("activation-sms")


def test_one_setting_changed_receiver_resets_every_cache(redis_client: redis.Redis) -> None:
    from django_delayqueue.conf import connection, queues

    before = (connection.get_client(), queues.get_queue("order-close"))
    queue_overrides.effective_settings("order-close")
    assert "order-close" in queue_overrides._cache
    with override_settings(DELAYQUEUE=delayqueue(PREFIX="other")):
        assert "order-close" not in queue_overrides._cache
        assert connection.get_client() is not before[0]
        q = queues.get_queue("order-close")
        assert q is not before[1] and q.keys.prefix == "other"
    assert queues.get_queue("order-close").keys.prefix == "dq"
