"""checks.servers: E010, W006, W007 and E011 against real redis-servers configured as
a shop's cache would be, with the deployment checks only, and never a crash."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_delayqueue.checks import check_settings
from django_delayqueue.checks.servers import check_redis_servers
from django_delayqueue.embedded import RedisServerProcess, free_port
from django_delayqueue.monitoring.servers import app_servers, findings

SERVER_IDS = {"delayqueue.E001", "delayqueue.E010", "delayqueue.W006", "delayqueue.W007"}


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


@contextmanager
def app_on(*args: str, embedded: bool = False, **changes: Any) -> Iterator[redis.Redis]:
    """The settings point at a redis-server started with ``args`` (not marked embedded)."""
    with RedisServerProcess(args=args, mark_embedded=embedded) as server:
        config = {**settings.DELAYQUEUE, "REDIS_URL": server.url, **changes}
        client = redis.Redis.from_url(server.url)
        with override_settings(DELAYQUEUE=config):
            yield client
        client.close()


def deploy_checks() -> list[Any]:
    return django_checks.run_checks(tags=["delayqueue"], include_deployment_checks=True)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_e010_a_redis_that_evicts_keys(policy: str) -> None:
    aof = ("--appendonly", "yes")
    with app_on("--maxmemory", "3mb", "--maxmemory-policy", policy, *aof) as client:
        (error,) = check_redis_servers()
        assert error.id == "delayqueue.E010" and error.level == django_checks.ERROR
        port = client.connection_pool.connection_kwargs["port"]
        assert f"127.0.0.1:{port}" in error.msg and f"maxmemory-policy {policy}" in error.msg
        assert "noeviction" in error.hint and "ACCEPT_DATA_LOSS_ON_EVICTION" in error.hint
        with pytest.raises(SystemCheckError, match=r"delayqueue\.E010"):
            call_command("check", "--deploy", "--tag", "delayqueue")


def test_w007_an_eviction_policy_accepted_is_a_warning() -> None:
    args = ("--maxmemory-policy", "allkeys-lru", "--appendonly", "yes")
    with app_on(*args, ACCEPT_DATA_LOSS_ON_EVICTION=True):
        (warning,) = check_redis_servers()
    assert warning.id == "delayqueue.W007" and "Accepted by" in warning.msg


def test_w006_a_redis_that_keeps_nothing_on_disk() -> None:
    with app_on("--save", "", "--appendonly", "no"):
        (warning,) = check_redis_servers()
    assert warning.id == "delayqueue.W006"
    assert "restart" in warning.msg and "appendonly yes" in warning.hint
    assert "SILENCED_SYSTEM_CHECKS" in warning.hint


def test_w006_silenced_is_not_said_by_runqueue_or_the_admin_either() -> None:
    with app_on("--save", ""), override_settings(SILENCED_SYSTEM_CHECKS=["delayqueue.W006"]):
        assert findings(app_servers()) == []  # what runqueue and the admin's banner read


@pytest.mark.parametrize(
    "persistence", [("--appendonly", "yes"), ("--save", "3600", "1")], ids=["aof", "rdb"]
)
def test_a_redis_that_persists_and_evicts_nothing_passes(persistence: tuple[str, ...]) -> None:
    with app_on(*persistence):
        assert check_redis_servers() == []


def test_the_embedded_server_of_the_tests_and_the_demo_passes(redis_client: redis.Redis) -> None:
    # It keeps nothing on purpose (and says so with its config file's name).
    assert not SERVER_IDS & set(ids(deploy_checks()))
    with app_on("--save", "", embedded=True):
        assert check_redis_servers() == []


def test_without_deploy_no_redis_is_asked() -> None:
    with app_on("--maxmemory-policy", "allkeys-lru"):
        assert not SERVER_IDS & set(ids(django_checks.run_checks(tags=["delayqueue"])))
        assert "delayqueue.E010" in ids(deploy_checks())


def test_a_redis_that_is_down_is_e001_and_never_a_crash() -> None:
    dead = {**settings.DELAYQUEUE, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with override_settings(DELAYQUEUE=dead):
        assert check_redis_servers() == []
        assert SERVER_IDS & set(ids(deploy_checks())) == {"delayqueue.E001"}
    cluster = {**dead, "CLUSTER": True}  # a cluster client connects as it is built
    with override_settings(DELAYQUEUE=cluster):
        assert SERVER_IDS & set(ids(deploy_checks())) == {"delayqueue.E001"}
    broken = {**settings.DELAYQUEUE, "REDIS_URL": "http://nope"}
    with override_settings(DELAYQUEUE=broken):
        assert check_redis_servers() == []  # E004 says what is wrong


@pytest.mark.parametrize(
    "changes",
    [
        {"ACCEPT_DATA_LOSS_ON_EVICTION": "yes"},
        {"ACCEPT_DATA_LOSS_ON_EVICTION": 1},
        {"HEALTH_MAX_MEMORY_PERCENT": 0},
        {"HEALTH_MAX_MEMORY_PERCENT": 150},
        {"HEALTH_MAX_MEMORY_PERCENT": "90"},
    ],
)
def test_e011_invalid_server_settings(changes: dict[str, Any]) -> None:
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, **changes}):
        found = check_settings()
        assert ids(found) == ["delayqueue.E011"]
        assert next(iter(changes)) in found[0].msg
        assert check_redis_servers() == []  # not judged with settings that are wrong
