"""django_delayqueue.conf.connection: one cached client from a URL or a django-redis cache alias."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_delayqueue.conf.connection import get_client, get_clock, make_client
from django_delayqueue.core import ConfigurationError, RedisClock, SystemClock
from django_delayqueue.embedded import RedisServerProcess


def delayqueue(**changes: Any) -> dict[str, Any]:
    return {**settings.DELAYQUEUE, **changes}


def test_client_is_cached_and_returns_bytes(redis_client: redis.Redis) -> None:
    client = get_client()
    assert get_client() is client
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_clients_speak_resp2_whatever_redis_py_defaults_to(
    redis_client: redis.Redis, redis_server: RedisServerProcess
) -> None:
    """redis-py 8 speaks RESP3 unless told (redis-py 5: RESP2): the client is declared RESP2,
    built from the settings or by ``core.client.connect`` (Spark executors), unless
    ``REDIS_OPTIONS`` ask for another."""
    from django_delayqueue.core.client import connect

    for client in (make_client(), connect(redis_server.url)):
        assert client.connection_pool.connection_kwargs["protocol"] == 2
        assert client.client_info().get("resp", "2") == "2"  # Redis 7 says which it speaks
        client.close()
    with override_settings(DELAYQUEUE=delayqueue(REDIS_OPTIONS={"protocol": 3})):
        client = make_client()
        assert client.connection_pool.connection_kwargs["protocol"] == 3
        client.close()


def test_settings_change_builds_a_new_client(redis_client: redis.Redis) -> None:
    before = get_client()
    with override_settings(DELAYQUEUE=delayqueue(PREFIX="other")):
        inside = get_client()
        assert inside is not before
        assert inside.ping()
    assert get_client() is not inside


def test_acl_user_and_password_in_the_url(
    redis_client: redis.Redis, redis_server: RedisServerProcess
) -> None:
    redis_client.acl_setuser(
        "dqtest", enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all"]
    )
    try:
        url = f"redis://dqtest:s3cret@127.0.0.1:{redis_server.port}/0"
        with override_settings(DELAYQUEUE=delayqueue(REDIS_URL=url)):
            assert get_client().acl_whoami() in ("dqtest", b"dqtest")
        bad = f"redis://dqtest:wrong@127.0.0.1:{redis_server.port}/0"
        with (
            override_settings(DELAYQUEUE=delayqueue(REDIS_URL=bad)),
            pytest.raises(redis.AuthenticationError),
        ):
            get_client().ping()
    finally:
        redis_client.acl_deluser("dqtest")


def test_rediss_url_uses_tls() -> None:
    with override_settings(DELAYQUEUE=delayqueue(REDIS_URL="rediss://u:p@redis.example:6380/0")):
        client = make_client()
    assert client.connection_pool.connection_class is redis.SSLConnection
    assert client.connection_pool.connection_kwargs["username"] == "u"


def test_not_a_redis_url_is_a_configuration_error() -> None:
    with (
        override_settings(DELAYQUEUE=delayqueue(REDIS_URL="http://example.com")),
        pytest.raises(ConfigurationError, match="REDIS_URL"),
    ):
        get_client()


def test_cache_alias_borrows_the_django_redis_connection(
    redis_client: redis.Redis, redis_server: RedisServerProcess
) -> None:
    from django_redis import get_redis_connection

    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "queues": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server.url},
    }
    config = {k: v for k, v in settings.DELAYQUEUE.items() if k != "REDIS_URL"}
    with override_settings(CACHES=caches, DELAYQUEUE={**config, "CACHE_ALIAS": "queues"}):
        client = get_client()
        assert client is get_redis_connection("queues")
        client.set("via-cache", "1")
    assert redis_client.get("via-cache") == b"1"


def test_unknown_cache_alias_is_a_configuration_error() -> None:
    config = {k: v for k, v in settings.DELAYQUEUE.items() if k != "REDIS_URL"}
    with (
        override_settings(DELAYQUEUE={**config, "CACHE_ALIAS": "missing"}),
        pytest.raises(ConfigurationError, match="missing"),
    ):
        get_client()


def test_clock_setting() -> None:
    assert isinstance(get_clock(), RedisClock)
    with override_settings(DELAYQUEUE=delayqueue(CLOCK="system")):
        assert isinstance(get_clock(), SystemClock)
    with (
        override_settings(DELAYQUEUE=delayqueue(CLOCK="sundial")),
        pytest.raises(ConfigurationError, match="CLOCK"),
    ):
        get_clock()


def test_the_sentinels_are_asked_in_resp2_too() -> None:
    """The Sentinel object's own connections (sentinel_kwargs) speak what the primary's do."""
    sentinel = {"hosts": [("127.0.0.1", 1)], "service_name": "main"}
    with override_settings(DELAYQUEUE=delayqueue(SENTINEL=sentinel)):
        client = make_client()  # connects lazily: no sentinel needed to build it
    sentinels = client.connection_pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["protocol"] for s in sentinels] == [2]
