"""django_delayqueue.checks: ids, hints, and never a crash (Redis down included)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

import django_delayqueue as dq
from django_delayqueue.checks import check_handlers, check_redis, check_settings
from django_delayqueue.embedded import free_port


def delayqueue(**changes: Any) -> dict[str, Any]:
    return {**settings.DELAYQUEUE, **changes}


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture
def dead_redis_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def test_the_demo_settings_pass() -> None:
    assert check_settings() == []
    assert check_handlers() == []  # the shop's handlers.py was autodiscovered


def test_e002_unknown_keys_everywhere() -> None:
    config = delayqueue(
        REDIS_ULR="typo",
        DEFAULTS={"max_attempt": 3},
        QUEUES={"a": {"visibility": 5}},
    )
    with override_settings(DELAYQUEUE=config):
        found = check_settings()
    assert ids(found) == ["delayqueue.E002"] * 3
    text = " ".join(m.msg for m in found)
    assert "'REDIS_ULR'" in text and "'max_attempt'" in text and "'visibility'" in text
    assert all(m.hint for m in found)


def test_e003_invalid_values_are_each_reported() -> None:
    config = delayqueue(
        QUEUES={
            "a": {"max_attempts": 0, "visibility_timeout": 0},
            "b": {"paused": "yes"},
            "c": {"time_limit": "long"},
            "d": ["not", "a", "dict"],
        }
    )
    with override_settings(DELAYQUEUE=config):
        found = check_settings()
    assert ids(found) == ["delayqueue.E003"] * 5
    assert "QUEUES']['a']" in found[0].msg


def test_e004_connection_settings() -> None:
    config = delayqueue(REDIS_URL="http://nope", CLOCK="sundial", PREFIX="bad prefix")
    with override_settings(DELAYQUEUE=config):
        found = check_settings()
    assert ids(found) == ["delayqueue.E004"] * 3
    with override_settings(DELAYQUEUE=delayqueue(CACHE_ALIAS="missing")):
        messages = [m.msg for m in check_settings()]
    assert any("both REDIS_URL and CACHE_ALIAS" in m for m in messages)
    assert any("'missing' is not in CACHES" in m for m in messages)


def test_e004_invalid_queue_name() -> None:
    with override_settings(DELAYQUEUE=delayqueue(QUEUES={"has space": {}})):
        assert ids(check_settings()) == ["delayqueue.E004"]


def test_e004_a_queue_name_with_the_prefix_separator_and_how_to_rename_it() -> None:
    # PREFIX "shop" + "eu:orders" would share every key with PREFIX "shop:eu" + "orders".
    with override_settings(DELAYQUEUE=delayqueue(PREFIX="shop", QUEUES={"eu:orders": {}})):
        (found,) = check_settings()
    assert found.id == "delayqueue.E004"
    assert "':' separates the key prefix from the queue name" in found.msg
    assert "Rename the queue" in found.hint and "drain" in found.hint
    with override_settings(DELAYQUEUE=delayqueue(PREFIX="shop:eu", QUEUES={"orders": {}})):
        assert check_settings() == []  # a prefix may hold ':'


def test_w001_queue_without_handler() -> None:
    queues = {**settings.DELAYQUEUE["QUEUES"], "lonely": {}}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        found = check_handlers()
    assert ids(found) == ["delayqueue.W001"]
    assert "'lonely'" in found[0].msg and "handlers.py" in found[0].hint


def test_e013_time_limit_not_above_the_soft_limit() -> None:
    queues = {
        "equal": {"soft_time_limit": 30, "time_limit": 30},
        "fine": {"soft_time_limit": 20, "time_limit": 30},
        "soft-only": {"soft_time_limit": 20},
    }
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        (found,) = check_settings()
    assert found.id == "delayqueue.E013" and "'equal'" in found.msg
    assert "time_limit (30s) must be greater than soft_time_limit (30s)" in found.msg
    assert "raise time_limit above it" in found.hint


def test_e003_limits_out_of_range() -> None:
    queues = {
        "a": {"time_limit": 0},
        "b": {"soft_time_limit": -1},
        "c": {"abort_grace_seconds": -1},
    }
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        found = check_settings()
    assert ids(found) == ["delayqueue.E003"] * 3


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("changes", "check_id", "said"),
    [
        (
            {"QUEUES": {"q": {"visibility_timeout": NAN}}},
            "delayqueue.E003",
            "DELAYQUEUE['QUEUES']['q']: visibility_timeout must be a finite number of seconds, "
            "not nan.",
        ),
        (
            {"DEFAULTS": {"backoff_max": INF}, "QUEUES": {"q": {}}},
            "delayqueue.E003",
            "DELAYQUEUE['QUEUES']['q']: backoff_max must be a finite number of seconds, not inf.",
        ),
        (
            {"QUEUES": {"q": {"time_limit": NAN}}},
            "delayqueue.E003",
            "DELAYQUEUE['QUEUES']['q']: time_limit must be a finite number of seconds, not nan.",
        ),
        (
            {"SETTINGS_REFRESH_SECONDS": NAN},
            "delayqueue.E004",
            "DELAYQUEUE['SETTINGS_REFRESH_SECONDS'] must be a finite number of seconds, 0 or "
            "more, not nan.",
        ),
        (
            {"HEALTH_MAX_OVERDUE_SECONDS": INF},
            "delayqueue.E011",
            "DELAYQUEUE['HEALTH_MAX_OVERDUE_SECONDS'] must be a finite number of seconds, above "
            "0 (or None: off), not inf.",
        ),
        (
            {"HEALTH_CONSUMER_SECONDS": NAN},
            "delayqueue.E011",
            "DELAYQUEUE['HEALTH_CONSUMER_SECONDS'] must be a finite number of seconds, above 0 "
            "(or None: off), not nan.",
        ),
        (
            {"OUTBOX_LEASE_SECONDS": INF},
            "delayqueue.E008",
            "DELAYQUEUE['OUTBOX_LEASE_SECONDS'] must be a finite number of seconds, above 0, "
            "not inf.",
        ),
    ],
)
def test_nan_and_infinity_are_refused_wherever_settings_give_seconds(
    changes: dict[str, Any], check_id: str, said: str
) -> None:
    """Issue 37: a visibility_timeout of NaN passed the checks (and ran: every comparison with
    NaN is false), as did NaN or infinity for the settings of the probe and the refresh."""
    with override_settings(DELAYQUEUE=delayqueue(**changes)):
        found = check_settings()
    assert [(m.id, m.msg) for m in found] == [(check_id, said)]


def test_seconds_settings_keep_their_allowed_values() -> None:
    changes = {
        "SETTINGS_REFRESH_SECONDS": 0,  # re-read at every use
        "HEALTH_MAX_OVERDUE_SECONDS": None,  # that check off
        "HEALTH_CONSUMER_SECONDS": 0.5,
    }
    with override_settings(DELAYQUEUE=delayqueue(**changes)):
        assert check_settings() == []


def test_e014_visibility_timeout_that_cannot_cover_the_time_limit() -> None:
    queues = {
        "short": {"visibility_timeout": 30, "time_limit": 29},
        "fine": {"visibility_timeout": 32, "time_limit": 30},
    }
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        (found,) = check_settings()
    assert found.id == "delayqueue.E014" and "'short'" in found.msg
    assert "at least time_limit + 2s (31s)" in found.hint


def test_w008_handler_time_limit_is_read_as_time_limit() -> None:
    queues = {"old": {"visibility_timeout": 30, "handler_time_limit": 120}}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        found = check_settings()
    # Enforced now: not covered, but a warning (W009), so that an upgrade still starts.
    assert ids(found) == ["delayqueue.W008", "delayqueue.W009"]
    assert "'handler_time_limit' is deprecated" in found[0].msg
    assert found[0].msg.startswith("DELAYQUEUE['QUEUES']['old']: ")
    assert "Rename 'handler_time_limit' to 'time_limit'" in found[0].hint
    with override_settings(DELAYQUEUE=delayqueue(DEFAULTS={"handler_time_limit": 5})):
        assert {m.id for m in check_settings()} == {"delayqueue.W008"}
    # What the old W002 asked for (visibility_timeout >= handler_time_limit) still starts.
    queues = {"old": {"visibility_timeout": 60, "handler_time_limit": 60}}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        assert not [m for m in check_settings() if m.is_serious()]
    # The new key set too: the coverage is an error again.
    queues = {"new": {"visibility_timeout": 60, "handler_time_limit": 60, "time_limit": 60}}
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        assert "delayqueue.E014" in ids(check_settings())


@pytest.fixture
def ghost_receiver() -> Iterator[None]:
    def receiver(**kwargs: Any) -> None:
        pass

    dq.topic("ghost").connect(receiver)
    yield
    dq.topic("ghost").disconnect(receiver)


def test_w003_handlers_for_a_queue_that_is_not_configured(ghost_receiver: None) -> None:
    found = check_handlers()
    assert ids(found) == ["delayqueue.W003"]
    assert "'ghost'" in found[0].msg


def test_e001_redis_unreachable(dead_redis_url: str) -> None:
    with override_settings(DELAYQUEUE=delayqueue(REDIS_URL=dead_redis_url)):
        found = check_redis()
    assert ids(found) == ["delayqueue.E001"]
    assert "REDIS_URL" in found[0].hint


def test_e001_silent_when_redis_answers(redis_client: Any) -> None:
    assert check_redis() == []


def test_redis_check_runs_with_deploy_only(dead_redis_url: str) -> None:
    with override_settings(DELAYQUEUE=delayqueue(REDIS_URL=dead_redis_url)):
        everyday = django_checks.run_checks(tags=["delayqueue"])
        assert "delayqueue.E001" not in ids(everyday)
        deploy = django_checks.run_checks(tags=["delayqueue"], include_deployment_checks=True)
        assert "delayqueue.E001" in ids(deploy)
        with pytest.raises(SystemCheckError, match=r"delayqueue\.E001"):
            call_command("check", "--deploy", "--tag", "delayqueue")


def test_checks_do_not_crash_on_nonsense() -> None:
    with override_settings(DELAYQUEUE={"QUEUES": ["a"], "DEFAULTS": 3}):
        assert ids(check_settings()) == ["delayqueue.E004"]
        assert check_handlers() == []
    with override_settings(DELAYQUEUE="redis://"):
        assert ids(check_settings()) == ["delayqueue.E004"]
        assert check_handlers() == []


def test_cluster_conflicts_and_bad_shards_are_reported_and_do_not_break_the_stats() -> None:
    from django_delayqueue.monitoring.stats import collect

    base = {**settings.DELAYQUEUE}
    for changed in (
        {"CLUSTER": "yes"},
        {"CLUSTER": True, "SENTINEL": {"hosts": [["127.0.0.1", 26379]]}},
    ):
        with override_settings(DELAYQUEUE={**base, **changed}):
            assert "delayqueue.E004" in ids(django_checks.run_checks(tags=["delayqueue"]))
    queues = {**base["QUEUES"], "bad-shards": {"shards": 0}}
    with override_settings(DELAYQUEUE={**base, "QUEUES": queues}):
        errors = django_checks.run_checks(tags=["delayqueue"])
        assert any(e.id == "delayqueue.E003" and "shards" in e.msg for e in errors)
        names = [s.queue for s in collect()]  # every queue still reported (was: it raised)
        assert "bad-shards" in names and "order-close" in names


def test_e015_flow_limits_that_cannot_be_read_or_split_are_refused_with_hints() -> None:
    queues = {
        "fine": {"rate_limit": "20/s burst 5", "max_in_flight": 10},
        "fine-sharded": {"rate_limit": "30/m", "max_in_flight": 3, "shards": 3},
        "no-unit": {"rate_limit": "20"},
        "per-day": {"rate_limit": "100/d"},
        "zero-cap": {"max_in_flight": 0},
        "float-cap": {"max_in_flight": 2.5},
        "cap-below-shards": {"max_in_flight": 2, "shards": 3},
        "burst-below-shards": {"rate_limit": "10/s burst 2", "shards": 3},
    }
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues)):
        found = check_settings()
    assert set(ids(found)) == {"delayqueue.E015"}
    by_queue = {name: [e for e in found if f"[{name!r}]" in e.msg] for name in queues}
    assert by_queue["fine"] == [] and by_queue["fine-sharded"] == []
    for name in ("no-unit", "per-day"):
        (error,) = by_queue[name]
        assert "rate_limit must be" in error.msg and '"20/s burst 5"' in error.hint
    for name in ("zero-cap", "float-cap"):
        (error,) = by_queue[name]
        assert "max_in_flight must be" in error.msg and "across every consumer" in error.hint
    for name in ("cap-below-shards", "burst-below-shards"):
        (error,) = by_queue[name]
        assert "number of shards (3)" in error.msg and "share" in error.hint


def test_w011_says_what_a_flow_key_gets_of_a_sharded_queues_limits() -> None:
    """A key's messages live on one shard: on a 4-shard queue with rate_limit 40/s a key's
    backlog runs at 10/s (issue 37). Said where the settings show the queue takes keys, and
    not where the key's own limits ask no more than the share."""
    sharded = {"rate_limit": "40/s", "max_in_flight": 8, "shards": 4}
    queues = {
        "keyed": {**sharded, "key_concurrency": 5},
        "by-schedule": dict(sharded),
        "within-share": {**sharded, "key_rate_limit": "5/s", "key_concurrency": 1},
        "unsharded": {"rate_limit": "40/s", "key_concurrency": 1},
        "no-keys-seen": dict(sharded),
        "by-task": dict(sharded),
    }
    schedules = {"sync": {"queue": "by-schedule", "every": 60, "payload": {}, "key": "store-7"}}
    tasks = {
        "default": {
            "BACKEND": "django_delayqueue.tasks.DelayQueueBackend",
            "QUEUES": ["by-task"],
            "OPTIONS": {"KEY_ARGUMENT": "phone"},
        }
    }
    with override_settings(DELAYQUEUE=delayqueue(QUEUES=queues, SCHEDULES=schedules), TASKS=tasks):
        found = check_settings()
    by_queue = {name: [e for e in found if f"[{name!r}]" in e.msg] for name in queues}
    (keyed,) = by_queue["keyed"]
    assert keyed.id == "delayqueue.W011"
    assert "about 10/s of its rate_limit '40/s'" in keyed.msg
    assert "at most 2 in flight of its max_in_flight 8" in keyed.msg
    assert "fewer shards" in keyed.hint
    for name in ("by-schedule", "by-task"):  # keys given by a schedule, by a task argument
        (warning,) = by_queue[name]
        assert warning.id == "delayqueue.W011"
    assert by_queue["within-share"] == by_queue["unsharded"] == by_queue["no-keys-seen"] == []


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (12345, "must be a string or None, not int"),
        ("", "must not be empty (None: no token)"),
        ("a token with spaces in it", "must be printable ASCII without spaces"),
        ("tok\u00e9n-0123456789abcdef", "must be printable ASCII without spaces"),
        ("short", "is 5 characters long; use 16 or more"),
    ],
)
def test_e018_a_monitoring_token_no_client_could_send_or_anyone_could_guess(
    token: Any, said: str
) -> None:
    with override_settings(DELAYQUEUE=delayqueue(MONITORING_TOKEN=token)):
        found = check_settings()
    assert ids(found) == ["delayqueue.E018"]
    assert said in found[0].msg
    if isinstance(token, str) and len(token) > 3:
        assert token not in found[0].msg  # a check's output lands in logs


@pytest.mark.parametrize("timeout", [0, -1, NAN, "2", None])
def test_e018_monitoring_timeout(timeout: Any) -> None:
    with override_settings(DELAYQUEUE=delayqueue(MONITORING_TIMEOUT_SECONDS=timeout)):
        assert ids(check_settings()) == ["delayqueue.E018"]


def test_e018_silent_for_a_good_token_and_timeout() -> None:
    good = {"MONITORING_TOKEN": "Zm9vYmFy-0123456789_abc~.", "MONITORING_TIMEOUT_SECONDS": 0.5}
    with override_settings(DELAYQUEUE=delayqueue(**good)):
        assert check_settings() == []
