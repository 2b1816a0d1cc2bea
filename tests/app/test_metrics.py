"""The Prometheus endpoint: gauges per state, overdue age, consumers, counters, 501, Redis down."""

from __future__ import annotations

import json
import sys

import pytest
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_delayqueue.core import Queue
from django_delayqueue.embedded import RedisServerProcess, free_port

URL = "/delayqueue/metrics/"


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(URL)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def journal(q: Queue, *outcomes: str) -> None:
    rows = [[f"m{i}", 0, 0, 0, 0, 1, o, ""] for i, o in enumerate(outcomes)]
    q.client.xadd(q.keys.journal, {"n": str(len(rows)), "o": json.dumps(rows)})


@pytest.fixture
def q(redis_client) -> Queue:
    return Queue(redis_client, "order-close", prefix="dq")


def test_gauges_per_queue_and_state(client, q, redis_client):
    now = q.clock.now_ms()
    q.schedule({"a": 1}, delay=600)
    q.schedule({"late": True}, at=now - 5000)  # already due 5 s ago: ready, waiting
    redis_client.zadd(q.keys.heartbeats, {"w1": now, "w2": now})
    redis_client.hset(q.keys.config, "paused", "true")
    m = scrape(client)
    oc = (("queue", "order-close"),)
    assert m[("delayqueue_messages", (*oc, ("state", "pending")))] == 1
    assert m[("delayqueue_messages", (*oc, ("state", "ready")))] == 1
    assert m[("delayqueue_messages", (*oc, ("state", "dead")))] == 0
    assert m[("delayqueue_oldest_overdue_seconds", oc)] >= 5
    assert m[("delayqueue_consumers_alive", oc)] == 2
    assert m[("delayqueue_paused", oc)] == 1
    assert m[("delayqueue_up", oc)] == 1
    sms = (("queue", "activation-sms"),)
    assert m[("delayqueue_oldest_overdue_seconds", sms)] == 0
    assert m[("delayqueue_paused", sms)] == 0


def test_delivery_counters_only_grow(client, q):
    journal(q, "ack", "ack", "retry")
    oc = (("queue", "order-close"),)
    first = scrape(client)
    assert first[("delayqueue_deliveries_total", oc)] == 3
    assert first[("delayqueue_failures_total", oc)] == 1
    assert first[("delayqueue_outcomes_total", (("outcome", "retry"), *oc))] == 1
    assert scrape(client)[("delayqueue_deliveries_total", oc)] == 3  # read twice, counted once
    journal(q, "garbage")
    third = scrape(client)
    assert third[("delayqueue_deliveries_total", oc)] == 4
    assert third[("delayqueue_failures_total", oc)] == 2
    assert third[("delayqueue_outcomes_total", (("outcome", "dead"), *oc))] == 1


def test_redis_down_reports_up_0_and_no_values(client):
    dead = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "REDIS_OPTIONS": {"socket_connect_timeout": 0.5},
        "QUEUES": {"order-close": {}},
    }
    with override_settings(DELAYQUEUE=dead):
        m = scrape(client)
    assert m[("delayqueue_up", (("queue", "order-close"),))] == 0
    assert not any(name == "delayqueue_messages" for name, _ in m)
    assert not any(name == "delayqueue_deliveries_total" for name, _ in m)
    ((_, server),) = [(n, labels) for n, labels in m if n == "delayqueue_redis_up"]
    assert m[("delayqueue_redis_up", server)] == 0
    assert not any(name == "delayqueue_redis_used_memory_bytes" for name, _ in m)


def test_each_redis_server_memory_policy_and_persistence(client):
    args = ("--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl", "--appendonly", "yes")
    with RedisServerProcess(args=args) as server:
        settings = override_settings(DELAYQUEUE={"REDIS_URL": server.url, "QUEUES": {}})
        with settings:
            m = scrape(client)
    s = (("server", f"127.0.0.1:{server.port}"),)
    assert m[("delayqueue_redis_up", s)] == 1
    assert 0 < m[("delayqueue_redis_used_memory_bytes", s)] < 100 * 1024 * 1024
    assert m[("delayqueue_redis_maxmemory_bytes", s)] == 100 * 1024 * 1024
    assert m[("delayqueue_redis_evicts", (("policy", "volatile-ttl"), *s))] == 1
    assert m[("delayqueue_redis_persistent", s)] == 1


def test_without_prometheus_client_it_says_how_to_get_it(client, monkeypatch, redis_client):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    response = client.get(URL)
    assert response.status_code == 501
    assert "pip install 'django-delayqueue[metrics]'" in response.content.decode()


def test_only_get_and_head(client, redis_client):
    assert client.post(URL).status_code == 405
    assert client.head(URL).status_code == 200


def test_flow_limits_are_exported_with_the_throttled_counter(client, q, redis_client):
    redis_client.hset(q.keys.config, mapping={"rate_limit": '"10/s"', "max_in_flight": "4"})
    limited = Queue(redis_client, "order-close", prefix="dq")
    limited.settings = limited.settings.replace(rate_limit="10/s", max_in_flight=4)
    limited.schedule_many([{"payload": i} for i in range(5)])
    assert len(limited.claim(5)) == 1  # the burst of 1: the other 4 wait on the rate
    m = scrape(client)
    oc = (("queue", "order-close"),)
    assert m[("delayqueue_rate_limit_per_second", oc)] == 10
    assert m[("delayqueue_max_in_flight", oc)] == 4
    assert m[("delayqueue_waiting_on_limit", (("limit", "rate"), *oc))] == 4
    assert m[("delayqueue_waiting_on_limit", (("limit", "in_flight"), *oc))] == 0
    assert m[("delayqueue_throttled_total", oc)] == 0  # none started late yet
    assert m[("delayqueue_started_last_second", oc)] >= 0
    assert ("delayqueue_throttled_total", (("queue", "activation-sms"),)) not in m


# --- issue 38: how late the work is now, what runs, dead letters named "dead" ---------------------


def test_work_overdue_now_is_exported_while_no_consumer_runs(client, q, redis_client):
    """Lateness is recorded as handlers start, so while no consumer runs it says nothing (a
    94 s outage read as NaN or the p99 of before). What waits says it: 30 messages 79 s past
    their time sit in pending (no consumer promoted them: ``ready`` stays 0) and one in ready;
    the gauges count all 31 and the oldest's age."""
    from django_delayqueue.core import ManualClock

    now = q.clock.now_ms()
    earlier = Queue(redis_client, "order-close", prefix="dq", clock=ManualClock(now - 80_000))
    earlier.schedule_many([{"payload": n, "delay": 1} for n in range(30)])  # due 79 s ago
    q.schedule({"now": True}, at=now - 10)  # due now: straight to ready
    m = scrape(client)
    oc = (("queue", "order-close"),)
    assert m[("delayqueue_messages", (*oc, ("state", "pending")))] == 30
    assert m[("delayqueue_messages", (*oc, ("state", "ready")))] == 1
    assert m[("delayqueue_overdue_messages", oc)] == 31
    assert m[("delayqueue_oldest_overdue_seconds", oc)] >= 79
    assert m[("delayqueue_consumers_alive", oc)] == 0
    assert m[("delayqueue_overdue_messages", (("queue", "activation-sms"),))] == 0


def test_messages_a_rate_limit_holds_are_not_overdue(client, q, redis_client):
    """Ready messages behind a flow limit wait as the site asked: not counted as overdue."""
    redis_client.hset(q.keys.config, mapping={"rate_limit": '"10/s"'})
    limited = Queue(redis_client, "order-close", prefix="dq")
    limited.settings = limited.settings.replace(rate_limit="10/s")
    limited.schedule_many([{"payload": i} for i in range(5)])
    assert len(limited.claim(5)) == 1  # the other 4 wait on the rate
    m = scrape(client)
    oc = (("queue", "order-close"),)
    assert m[("delayqueue_messages", (*oc, ("state", "ready")))] == 4
    assert m[("delayqueue_overdue_messages", oc)] == 0


def test_running_handlers_and_those_past_their_time_limit(client, q):
    """A stalled handler (one its time limit could not stop) shows as
    delayqueue_stalled_handlers for a queue with a time_limit; the longest-running handler's
    age for every queue with consumers."""
    from django.conf import settings

    from django_delayqueue.core import Message
    from django_delayqueue.core.consumer.handlers.contracts import RunningHandler
    from django_delayqueue.core.consumer.rounds.details import heartbeat_details

    now = q.clock.now_ms()
    for name, started_ago in (("c1", 5000), ("c2", 100)):
        message = Message(f"m-{name}", q.name, None, 0, 0, 1, "1")
        running = [RunningHandler(message, 0.0, now - started_ago, 1)]
        q.client.zadd(q.keys.heartbeats, {name: now})
        q.client.hset(q.keys.consumer_details, name, heartbeat_details(q.name, 1, running, None))
    queues = {**settings.DELAYQUEUE["QUEUES"]}
    queues["order-close"] = {**queues["order-close"], "time_limit": 2}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        m = scrape(client)
    oc = (("queue", "order-close"),)
    assert m[("delayqueue_stalled_handlers", oc)] == 1  # 5 s past a 2 s limit
    assert m[("delayqueue_longest_running_seconds", oc)] >= 5
    assert ("delayqueue_stalled_handlers", (("queue", "activation-sms"),)) not in m


def test_dead_letters_are_named_dead_in_every_family(client, q, redis_client):
    """One word for a dead letter: the journal's counter, the consumers' counter and the
    state gauge all say "dead" (the journal's said "garbage")."""
    q.schedule("x", id="x")
    (m,) = q.claim(1)
    q.bury(m, "poison")  # one message in the dead letters
    journal(q, "garbage")  # and the journal's word for its outcome
    text = client.get(URL).content.decode()
    outcome_labels = {
        s.labels.get("outcome")
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "outcome" in s.labels
    }
    state_labels = {
        s.labels.get("state")
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "state" in s.labels
    }
    assert "garbage" not in outcome_labels | state_labels
    assert "dead" in outcome_labels and "dead" in state_labels


def test_the_exposition_passes_promtool_check_metrics(client, q, redis_client):
    """Prometheus' own linter, on an exposition with every family this app exports: queue
    gauges and counters, flow limits, keys, timings histograms, schedules, servers."""
    import shutil
    import subprocess

    from ci_support import skip_or_fail

    promtool = shutil.which("promtool")
    if promtool is None:
        skip_or_fail("promtool not found (Debian: apt-get install prometheus)")
    redis_client.hset(q.keys.config, mapping={"rate_limit": '"10/s"'})
    limited = Queue(redis_client, "order-close", prefix="dq")
    limited.settings = limited.settings.replace(rate_limit="10/s")
    limited.schedule_many([{"payload": i, "key": f"k{i % 2}"} for i in range(5)])
    limited.claim(5)
    redis_client.hset(q.keys.timings, mapping={"l3": 2, "l20": 1, "l_sum": 90_004, "o_ack": 3})
    journal(q, "ack", "garbage")
    text = client.get(URL).content.decode()
    assert "delayqueue_start_lateness_seconds_bucket" in text
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.django_db
def test_a_scrape_that_builds_a_queue_first_leaves_the_apps_queue_on_the_apps_client(
    client, redis_client
):
    """The scrape reads the recurring schedules' states through get_queue, under the
    monitoring reads: when it was the first in the process to build a queue, the cache kept
    a Queue holding the monitoring client (its short timeouts, its own pool) and clock, which
    every later schedule, cancel or relay of that queue then ran on."""
    from django.conf import settings

    from django_delayqueue.conf import queues as conf_queues
    from django_delayqueue.conf.connection import get_client, get_clock

    cfg = {
        **settings.DELAYQUEUE,
        "QUEUES": {**settings.DELAYQUEUE["QUEUES"], "reports": {}},
        "SCHEDULES": {"nightly": {"queue": "reports", "every": 60, "payload": None}},
        "MONITORING_TIMEOUT_SECONDS": 0.5,
    }
    with override_settings(DELAYQUEUE=cfg):
        conf_queues.reset()
        m = scrape(client)
        assert ("delayqueue_schedule_paused", (("queue", "reports"), ("schedule", "nightly"))) in m
        q = conf_queues.get_queue("reports")
        assert q.client is get_client() and q.clock is get_clock()
        assert q.client.connection_pool.connection_kwargs["socket_timeout"] == 30
