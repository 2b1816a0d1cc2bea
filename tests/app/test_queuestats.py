"""``manage.py queuestats``: table, JSON, queue selection, watch mode, Redis down."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess, free_port


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("queuestats", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def q(redis_client) -> Queue:
    queue = Queue(redis_client, "order-close", prefix="dq")
    queue.schedule({"order_id": 1}, delay=600)
    queue.schedule({"order_id": 2}, delay=600)
    queue.schedule({"order_id": 3})
    (message,) = queue.claim(1)
    queue.bury(message, "poison")
    redis_client.zadd(queue.keys.heartbeats, {"worker-1": queue.clock.now_ms()})
    return queue


def test_table_has_a_row_per_configured_queue(q):
    out, err = run()
    lines = out.splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "PENDING",
        "READY",
        "UNACK",
        "RETRY",
        "DEAD",
        "OVERDUE",
        "CONSUMERS",
        "PAUSED",
        "DELIVERED",
        "FAILED",
        "ALREADY_DONE",
    ]
    assert lines[1].split() == [
        *("order-close", "2", "0", "0", "0", "1", "0", "1", "no", "0", "0", "0")
    ]
    assert lines[2].split()[0] == "activation-sms"
    assert err == ""


def test_json_and_queue_selection(q):
    out, _ = run("order-close", "--json")
    document = json.loads(out)
    (stats,) = document["queues"]
    assert stats["queue"] == "order-close"
    assert stats["counts"] == {"pending": 2, "ready": 0, "unack": 0, "retry": 0, "garbage": 1}
    assert stats["consumers_alive"] == 1 and stats["consumers"][0]["name"] == "worker-1"
    assert stats["paused"] is False and stats["errors"] == []
    assert "time" in document


def test_unknown_queue_is_a_command_error(redis_client):
    with pytest.raises(CommandError, match="unknown queue 'nope'"):
        run("nope")


def test_watch_refreshes_count_times_as_json_lines(q):
    out, _ = run("--json", "--watch", "0.01", "--count", "3")
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) == 3
    assert all(d["queues"][0]["counts"]["garbage"] == 1 for d in documents)


def test_watch_table_prints_a_timestamp_per_refresh(q):
    out, _ = run("order-close", "--watch", "0.01", "--count", "2")
    assert out.count("QUEUE") == 2 and out.count("order-close") == 2


def test_watch_needs_a_positive_interval(redis_client):
    with pytest.raises(CommandError):
        run("--watch", "0")


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_watch_refuses_nan_and_infinity_by_name(redis_client, value):
    """Before: ``--watch inf`` slept for ever after its first table, ``nan`` raised from
    time.sleep (ValueError, a traceback)."""
    expected = f"--watch: expected a finite number of seconds, above 0, not '{value}'"
    with pytest.raises(CommandError, match=expected):
        run("--watch", value, "--count", "1")
    with pytest.raises(CommandError, match="--watch must be a finite number of seconds"):
        call_command("queuestats", watch=float(value), count=1, stdout=StringIO())


def test_redis_down_prints_dashes_and_fails():
    dead = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "REDIS_OPTIONS": {"socket_connect_timeout": 0.5},
        "QUEUES": {"order-close": {}},
    }
    out, err = StringIO(), StringIO()
    with override_settings(DELAYQUEUE=dead), pytest.raises(CommandError, match="could not read"):
        call_command("queuestats", stdout=out, stderr=err)
    row = out.getvalue().splitlines()[1].split()
    # Everything read from Redis is "-"; paused falls back to the settings file.
    assert row == ["order-close", *["-"] * 7, "no", "-", "-", "-"]
    assert "error:" in err.getvalue()


def test_each_redis_server_is_shown_with_its_memory_and_policy(q):
    out, err = run()
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("REDIS SERVER"))
    assert lines[header].split() == [
        "REDIS",
        "SERVER",
        "VERSION",
        "MEMORY",
        "POLICY",
        "PERSISTENCE",
    ]
    row = lines[header + 1]
    assert "(no maxmemory)" in row and row.split()[-2:] == ["noeviction", "none"]
    assert err == ""  # the embedded server of the tests: nothing to warn of
    (server,) = json.loads(run("--json")[0])["servers"]
    assert server["policy"] == "noeviction" and server["maxmemory"] == 0
    assert server["used_memory"] > 0 and server["evicts"] is False


def test_a_redis_that_evicts_is_shown_and_warned_of():
    args = ("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
    with RedisServerProcess(args=args, mark_embedded=False) as server:
        config = {"REDIS_URL": server.url, "QUEUES": {"order-close": {}}}
        with override_settings(DELAYQUEUE=config):
            out, err = run()
    row = out.splitlines()[-1]
    assert "of 100.0 MB" in row and "allkeys-lru" in row and row.endswith("none")
    assert "warning: Redis" in err and "maxmemory-policy allkeys-lru" in err
    assert "keeps nothing on disk" in err


def test_flow_limits_are_shown_with_what_waits_on_them(redis_client):
    queue = Queue(redis_client, "activation-sms", prefix="dq")
    redis_client.hset(queue.keys.config, mapping={"rate_limit": '"20/s burst 5"'})
    queue.settings = queue.settings.replace(rate_limit="20/s burst 5")
    queue.schedule_many([{"payload": i} for i in range(12)])
    assert len(queue.claim(12)) == 5  # the burst; 7 wait on the rate
    out, _ = run()
    section = out.split("\n\n")[1].splitlines()
    assert section[0].split() == [
        "QUEUE", "RATE", "LIMIT", "MAX", "IN", "FLIGHT", "RATE", "NOW", "WAITING", "HELD", "BY",
        "THROTTLED", "PER", "KEY", "ON", "KEYS",
    ]  # fmt: skip
    assert section[1].split()[:5] == ["activation-sms", "20/s", "burst", "5", "-"]
    assert section[1].split()[-5:] == ["7", "rate", "0", "-", "-"]  # no key limits
    assert len(section) == 2  # only the queues with limits
    (stats,) = json.loads(run("activation-sms", "--json")[0])["queues"]
    flow = stats["flow"]
    assert (flow["rate_limit"], flow["rate_limit_per_second"], flow["max_in_flight"]) == (
        "20/s burst 5",
        20.0,
        None,
    )
    assert (flow["waiting_on_limit"], flow["held_by"], flow["throttled"]) == (7, "rate", 0)
