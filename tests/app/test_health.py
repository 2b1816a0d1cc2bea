"""The readiness probe: Redis reachable, consumers alive, nothing overdue beyond a threshold."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_delayqueue.core import Queue
from django_delayqueue.embedded import free_port

URL = "/delayqueue/health/"
QUEUES = ("order-close", "activation-sms")

# The probe reads the outbox backlog from the database too.
pytestmark = pytest.mark.django_db


def delayqueue(**extra):
    return override_settings(DELAYQUEUE={**settings.DELAYQUEUE, **extra})


@pytest.fixture
def queues(redis_client) -> dict[str, Queue]:
    return {name: Queue(redis_client, name, prefix="dq") for name in QUEUES}


def beat(q: Queue, seconds_ago: float = 0) -> None:
    q.client.zadd(q.keys.heartbeats, {"worker": q.clock.now_ms() - int(seconds_ago * 1000)})


def test_healthy(client, queues):
    for q in queues.values():
        beat(q)
    response = client.get(URL)
    assert response.status_code == 200
    report = response.json()
    assert report["status"] == "ok"
    assert {name: c["ok"] for name, c in report["checks"].items()} == {
        "redis": True,
        "consumers": True,
        "starting": True,
        "overdue": True,
        "outbox": True,
        "eviction": True,
        "envelope_formats": True,
    }
    assert report["checks"]["outbox"]["databases"] == {
        "default": {"waiting": 0, "oldest_seconds": 0.0}
    }
    assert report["queues"]["order-close"]["consumers_alive"] == 1
    (server,) = report["servers"]
    assert server["policy"] == "noeviction" and server["embedded"] is True
    assert server["used_memory"] > 0 and server["maxmemory"] == 0
    assert response["Cache-Control"] == "no-store"


def test_a_queue_without_a_live_consumer_fails(client, queues):
    beat(queues["order-close"])
    beat(queues["activation-sms"], seconds_ago=120)  # stale: the worker died
    response = client.get(URL)
    assert response.status_code == 503
    report = response.json()
    assert report["status"] == "fail"
    assert report["checks"]["consumers"]["failing"] == {
        "activation-sms": "no consumer heartbeat in the last 30 s"
    }
    assert report["checks"]["redis"]["ok"] and report["checks"]["overdue"]["ok"]


def test_consumer_window_and_switch_off(client, queues):
    for q in queues.values():
        beat(q, seconds_ago=120)
    with delayqueue(HEALTH_CONSUMER_SECONDS=300):
        assert client.get(URL).status_code == 200
    with delayqueue(HEALTH_CONSUMER_SECONDS=None):
        response = client.get(URL)
    assert response.status_code == 200 and "consumers" not in response.json()["checks"]


def test_paused_queues_are_not_checked(client, queues, redis_client):
    beat(queues["order-close"])
    sms = queues["activation-sms"]
    redis_client.hset(sms.keys.config, "paused", "true")  # as the settings mirror publishes
    sms.schedule({"late": 1}, at=sms.clock.now_ms() - 3_600_000)  # an hour overdue, paused
    assert client.get(URL).status_code == 200


def test_overdue_beyond_the_threshold_fails(client, queues):
    for q in queues.values():
        beat(q)
    q = queues["order-close"]
    q.schedule({"late": 1}, at=q.clock.now_ms() - 120_000)  # due 2 min ago, not delivered
    response = client.get(URL)
    assert response.status_code == 503
    overdue = response.json()["checks"]["overdue"]
    assert overdue["max_seconds"] == 60
    assert list(overdue["failing"]) == ["order-close"]
    assert overdue["failing"]["order-close"].startswith("oldest due message waiting 2 min")
    with delayqueue(HEALTH_MAX_OVERDUE_SECONDS=600):
        assert client.get(URL).status_code == 200
    with delayqueue(HEALTH_MAX_OVERDUE_SECONDS=None):
        assert client.get(URL).status_code == 200


def test_redis_down_fails(client):
    dead = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "REDIS_OPTIONS": {"socket_connect_timeout": 0.5},
        "QUEUES": {"order-close": {}},
    }
    with override_settings(DELAYQUEUE=dead):
        response = client.get(URL)
    assert response.status_code == 503
    redis = response.json()["checks"]["redis"]
    assert redis["ok"] is False and "unreachable" in redis["errors"][0].lower()


def test_no_queues_configured_pings_redis(client, redis_client):
    with delayqueue(QUEUES={}):
        assert client.get(URL).status_code == 200
    dead = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "QUEUES": {}}
    with override_settings(DELAYQUEUE=dead):
        response = client.get(URL)
    assert response.status_code == 503 and response.json()["checks"]["redis"]["ok"] is False


def test_post_is_refused(client, redis_client):
    assert client.post(URL).status_code == 405


def test_an_outbox_message_waiting_too_long_fails_the_outbox_check(client, queues):
    from datetime import timedelta

    from django.utils import timezone

    from django_delayqueue.models import OutboxMessage

    for q in queues.values():
        beat(q)
    created = timezone.now() - timedelta(seconds=90)
    OutboxMessage.objects.create(
        queue="order-close", message_id="m", due_ms=0, envelope="{}", created_at=created
    )
    response = client.get(URL)
    assert response.status_code == 503
    outbox = response.json()["checks"]["outbox"]
    assert not outbox["ok"] and outbox["max_seconds"] == 60
    assert outbox["databases"]["default"]["waiting"] == 1
    assert "has waited 1 min" in outbox["failing"]["default"]


@pytest.fixture
def own_redis():
    """Settings on a redis-server of the test's own (``args``), with no queue to look at."""
    from django_delayqueue.embedded import RedisServerProcess

    @contextmanager
    def start(*args, **extra):
        with RedisServerProcess(args=args) as server:
            admin = redis.Redis.from_url(server.url)
            with delayqueue(REDIS_URL=server.url, QUEUES={}, **extra):
                yield admin
            admin.close()

    return start


def test_a_redis_that_evicts_keys_fails_the_eviction_check(client, own_redis):
    with own_redis("--maxmemory-policy", "allkeys-lru"):
        response = client.get(URL)
    assert response.status_code == 503
    (failing,) = response.json()["checks"]["eviction"]["failing"].values()
    assert "maxmemory-policy allkeys-lru" in failing
    with own_redis("--maxmemory-policy", "allkeys-lru", ACCEPT_DATA_LOSS_ON_EVICTION=True):
        response = client.get(URL)
    assert response.status_code == 200  # accepted: the servers report still says it
    assert response.json()["servers"][0]["evicts"] is True


def test_memory_past_the_threshold_fails_when_asked_for(client, own_redis):
    with own_redis("--maxmemory", "100mb"):
        assert "memory" not in client.get(URL).json()["checks"]  # off by default
    with own_redis("--maxmemory", "100mb", HEALTH_MAX_MEMORY_PERCENT=90) as admin:
        assert client.get(URL).status_code == 200  # a few MB of 100: fine
        used = admin.info("memory")["used_memory"]
        admin.config_set("maxmemory", int(used / 0.95))  # 95% used
        response = client.get(URL)
        assert response.status_code == 503
        memory = response.json()["checks"]["memory"]
        assert memory["max_percent"] == 90
        (said,) = memory["failing"].values()
        assert said.endswith("% of maxmemory used")
        admin.config_set("maxmemory", 1)  # full: writes are refused
        (said,) = client.get(URL).json()["checks"]["memory"]["failing"].values()
        assert said.startswith("out of memory")


def test_each_queue_lists_its_supervisors_and_its_stalled_messages(client, queues):
    """What supervised consumer processes write with their heartbeats
    (core.consumer.rounds.details): the probe groups them under their supervisor and counts the
    messages past ``time_limit``."""
    from django_delayqueue.core import Message
    from django_delayqueue.core.consumer.handlers.contracts import RunningHandler
    from django_delayqueue.core.consumer.rounds.details import heartbeat_details

    q = queues["order-close"]
    now = q.clock.now_ms()
    supervisor = {"name": "runqueue-web-1", "pid": 4321, "slot": 1}
    for name, started_ago in (("runqueue-web-1.1-11", 5000), ("runqueue-web-1.2-12", 100)):
        message = Message(f"m-{name}", q.name, None, 0, 0, 1, "1")
        running = [RunningHandler(message, 0.0, now - started_ago, 1)]
        q.client.zadd(q.keys.heartbeats, {name: now})
        q.client.hset(
            q.keys.consumer_details, name, heartbeat_details(q.name, 3, running, supervisor)
        )
    beat(queues["activation-sms"])
    limited = {**settings.DELAYQUEUE["QUEUES"]}
    limited["order-close"] = {**limited["order-close"], "time_limit": 2}
    with delayqueue(QUEUES=limited):
        report = client.get(URL).json()
    order_close = report["queues"]["order-close"]
    assert order_close["consumers_alive"] == 2
    (group,) = order_close["supervisors"]
    assert group["pid"] == 4321 and sorted(group["consumers"]) == [
        "runqueue-web-1.1-11",
        "runqueue-web-1.2-12",
    ]
    assert order_close["stalled"] == 1  # 5 s past a 2 s limit; the other has run 0.1 s
    assert report["queues"]["activation-sms"]["supervisors"] == []


# --- issue 38: probes that fit Kubernetes, a deadline of their own, a token ----------------------


def refusing() -> dict:
    """Settings on a port where nothing listens: Redis refuses every connection."""
    return {
        **settings.DELAYQUEUE,
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "QUEUES": {"order-close": {}},
    }


def test_redis_refusing_connections_is_said_as_redis_down_not_as_missing_heartbeats(client):
    """With Redis refusing connections the report said no consumer had a heartbeat: what
    fails is Redis, and the checks that read it are not run at all."""
    with override_settings(DELAYQUEUE=refusing()):
        response = client.get(URL)
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert [name for name, c in checks.items() if not c["ok"]] == ["redis"]
    assert "consumers" not in checks and "overdue" not in checks
    (error,) = checks["redis"]["errors"]
    assert error.startswith("Redis unreachable: ") and "heartbeat" not in response.content.decode()


def test_a_web_pods_readiness_asks_for_redis_alone(client, queues):
    """Workers stopped gracefully (no heartbeat left) with work overdue: the full report
    fails, but a web pod's readiness, ``?check=redis``, passes: stopping the workers must not
    take the site out of its load balancer. A check that does not exist is a 400 naming the
    known ones."""
    from django_delayqueue.core import ManualClock

    q = queues["order-close"]
    earlier = Queue(q.client, q.name, prefix="dq", clock=ManualClock(q.clock.now_ms() - 120_000))
    earlier.schedule({"late": True}, delay=1)
    assert client.get(URL).status_code == 503
    response = client.get(URL, {"check": "redis"})
    assert response.status_code == 200
    assert response.json()["checks"] == {"redis": {"ok": True}}
    both = client.get(URL, {"check": "redis,overdue"})
    assert both.status_code == 503 and set(both.json()["checks"]) == {"redis", "overdue"}
    bad = client.get(URL, {"check": "redis,nope"})
    assert bad.status_code == 400 and "unknown check 'nope'" in bad.json()["error"]
    assert "known: redis, consumers" in bad.json()["error"]


def test_a_redis_down_fails_a_probe_that_asked_for_a_check_reading_it(client):
    with override_settings(DELAYQUEUE=refusing()):
        response = client.get(URL, {"check": "consumers"})
        outbox_only = client.get(URL, {"check": "outbox"})
    assert response.status_code == 503 and not response.json()["checks"]["redis"]["ok"]
    assert outbox_only.status_code == 200  # the outbox is what covers Redis being down


@pytest.fixture
def frozen_redis():
    """A redis-server of the test's own, stopped with SIGSTOP: connections are accepted by the
    kernel, no command ever gets a reply (as a Redis stuck in a fork, a swap storm or a long
    script). Let go again at the end."""
    import os
    import signal

    from django_delayqueue.embedded import RedisServerProcess

    with RedisServerProcess() as server:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            yield server
        finally:
            os.kill(server.pid, signal.SIGCONT)


def test_a_frozen_redis_fails_the_probe_within_the_monitoring_timeout(client, frozen_redis):
    """A frozen Redis held metrics/ and health/ for as long as the app's client waits for a
    reply (30 s): longer than a probe or a scrape waits. Their reads have a timeout of their
    own, MONITORING_TIMEOUT_SECONDS, which the report names; the metrics say every queue and
    server is down."""
    frozen = {
        **settings.DELAYQUEUE,
        "REDIS_URL": frozen_redis.url,
        "MONITORING_TIMEOUT_SECONDS": 0.3,
        "QUEUES": {"order-close": {}},
    }
    with override_settings(DELAYQUEUE=frozen):
        response = client.get(URL)
        metrics = client.get("/delayqueue/metrics/")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"]["errors"] == [
        "Redis unreachable: no reply within 300 ms"
    ]
    assert metrics.status_code == 200
    text = metrics.content.decode()
    assert 'delayqueue_up{queue="order-close"} 0.0' in text
    assert f'delayqueue_redis_up{{server="127.0.0.1:{frozen_redis.port}"}} 0.0' in text


def test_the_monitoring_reads_use_a_client_with_short_timeouts(redis_client):
    """The clients the endpoints read with: the app's waits 30 s, theirs the setting's."""
    from django_delayqueue.conf.connection import get_client, monitoring_reads

    with delayqueue(MONITORING_TIMEOUT_SECONDS=1.5):
        usual = get_client().connection_pool.connection_kwargs
        with monitoring_reads():
            probe = get_client().connection_pool.connection_kwargs
        assert get_client().connection_pool.connection_kwargs is usual  # back after
    assert usual["socket_timeout"] == 30
    assert probe["socket_timeout"] == 1.5 and probe["socket_connect_timeout"] == 1.5


TOKEN = "s3cret-token-for-probes-0123456789"


def test_with_a_token_an_anonymous_failing_report_names_nothing(client):
    """A failing report named Redis addresses (and database aliases) to whoever asked. With
    MONITORING_TOKEN set, a request without it gets the status and which checks pass; the
    token (as a Kubernetes probe's httpHeaders send it) gets the details; a wrong one a 401."""
    dead = {**refusing(), "MONITORING_TOKEN": TOKEN}
    port = dead["REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
    with override_settings(DELAYQUEUE=dead):
        anonymous = client.get(URL)
        granted = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        wrong = client.get(URL, HTTP_AUTHORIZATION="Bearer guess")
    assert anonymous.status_code == 503
    assert anonymous.json() == {
        "status": "fail",
        "checks": {"redis": {"ok": False}, "outbox": {"ok": True}},
    }
    body = anonymous.content.decode()
    assert port not in body and "127.0.0.1" not in body and "default" not in body
    assert granted.status_code == 503 and port in granted.json()["checks"]["redis"]["errors"][0]
    assert "default" in granted.json()["checks"]["outbox"]["databases"]
    assert wrong.status_code == 401 and wrong["WWW-Authenticate"].startswith("Bearer")


def test_with_a_token_the_metrics_need_it(client, redis_client):
    """Prometheus' ``authorization`` block sends ``Authorization: Bearer <credentials>``."""
    with delayqueue(MONITORING_TOKEN=TOKEN):
        assert client.get("/delayqueue/metrics/").status_code == 401
        assert client.get("/delayqueue/metrics/", HTTP_AUTHORIZATION="Bearer no").status_code == 401
        assert (
            client.get("/delayqueue/metrics/", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code
            == 401
        )
        ok = client.get("/delayqueue/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert ok.status_code == 200 and b"delayqueue_up" in ok.content
    assert client.get("/delayqueue/metrics/").status_code == 200  # open without a token set


class UnusableClient:
    """Stands for the app's Redis client where none may be used: records each use."""

    def __init__(self) -> None:
        self.used: list[str] = []

    def __getattr__(self, name: str):
        self.used.append(name)
        raise AssertionError(f"the app's client was used: .{name}")


def test_a_cluster_down_is_reported_by_the_monitoring_reads_without_the_apps_client(client):
    """A cluster client connects as it is built: with the cluster down, the monitoring client
    could not be built and the reads fell back to the app's client, whose timeouts (5 s to
    connect, 30 s for a reply) and retries are what probes and scrapes must not wait out.
    Redis is reported down at once, and the app's client is not asked anything."""
    from django_delayqueue.conf import connection

    down = {**refusing(), "CLUSTER": True, "MONITORING_TIMEOUT_SECONDS": 0.5}
    with override_settings(DELAYQUEUE=down):
        unusable = UnusableClient()
        connection._client = unusable
        try:
            response = client.get(URL)
            metrics = client.get("/delayqueue/metrics/")
        finally:
            connection.reset()
    assert unusable.used == []
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert [name for name, c in checks.items() if not c["ok"]] == ["redis"]
    (error,) = checks["redis"]["errors"]
    assert error.startswith("Redis unreachable: no monitoring client: ")
    assert metrics.status_code == 200
    assert 'delayqueue_up{queue="order-close"} 0.0' in metrics.content.decode()


def test_a_probe_asking_for_a_check_that_is_turned_off_gets_a_400_naming_its_setting(
    client, queues
):
    """``?check=memory`` without HEALTH_MAX_MEMORY_PERCENT (or ``?check=lateness`` without
    HEALTH_LATENESS) ran nothing and answered 200 "ok" (no check, all of none passing): a
    probe that can never fail. It is a 400 naming the setting that turns the check on."""
    for q in queues.values():
        beat(q)
    memory = client.get(URL, {"check": "memory"})
    assert memory.status_code == 400
    assert memory.json() == {
        "error": "check 'memory' is turned off: set DELAYQUEUE['HEALTH_MAX_MEMORY_PERCENT'] "
        "to a percentage (e.g. 90) to turn it on"
    }
    lateness = client.get(URL, {"check": "redis,lateness"})
    assert lateness.status_code == 400
    assert lateness.json()["error"] == (
        "check 'lateness' is turned off: set DELAYQUEUE['HEALTH_LATENESS'] = True to turn it on"
    )
    with delayqueue(HEALTH_CONSUMER_SECONDS=None, HEALTH_MAX_OVERDUE_SECONDS=None):
        both = client.get(URL, {"check": ["overdue", "consumers"]})
        assert both.status_code == 400
        assert both.json()["error"] == (
            "check 'consumers' is turned off: set DELAYQUEUE['HEALTH_CONSUMER_SECONDS'] to a "
            "number of seconds to turn it on; check 'overdue' is turned off: set "
            "DELAYQUEUE['HEALTH_MAX_OVERDUE_SECONDS'] to a number of seconds to turn it on"
        )
        assert client.get(URL).status_code == 200  # all checks: those off are left out
    with delayqueue(HEALTH_MAX_MEMORY_PERCENT=90, HEALTH_LATENESS=True):
        on = client.get(URL, {"check": "memory,lateness"})
    assert on.status_code == 200 and set(on.json()["checks"]) == {"memory", "lateness"}


def test_a_redis_whose_info_cannot_be_read_fails_the_eviction_check(client, own_redis):
    """A user whose ACL denies INFO: the policy is unknown, so the check cannot pass (a probe
    asking for it alone would otherwise pass with nothing checked). With the data loss
    accepted, what the policy is does not matter."""
    with own_redis() as admin:
        admin.acl_setuser(
            "probe",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-info"],
        )
        kwargs = admin.connection_pool.connection_kwargs
        probe = f"redis://probe:pw@{kwargs['host']}:{kwargs['port']}/0"
        with delayqueue(REDIS_URL=probe, QUEUES={}):
            asked = client.get(URL, {"check": "eviction"})
            full = client.get(URL)
        with delayqueue(REDIS_URL=probe, QUEUES={}, ACCEPT_DATA_LOSS_ON_EVICTION=True):
            accepted = client.get(URL, {"check": "eviction"})
    assert asked.status_code == 503, asked.json()
    (said,) = asked.json()["checks"]["eviction"]["failing"].values()
    assert said.startswith("could not read the server's INFO")
    assert "NoPermissionError" in said
    assert full.status_code == 503 and not full.json()["checks"]["eviction"]["ok"]
    assert accepted.status_code == 200 and accepted.json()["checks"]["eviction"]["ok"]


def test_an_unreachable_database_fails_the_outbox_check(client, queues):
    """The outbox covers Redis being down: a probe of it must not pass while its database
    cannot be read (as it did: a database that cannot be read looked like one without the
    outbox table, and the check was left out)."""
    from unittest import mock

    from django.db import OperationalError, connections

    for q in queues.values():
        beat(q)
    down = OperationalError('connection to server at "db" (10.0.0.5), port 5432 failed')
    with mock.patch.object(connections["default"], "ensure_connection", side_effect=down):
        asked = client.get(URL, {"check": "outbox"})
        full = client.get(URL)
    assert asked.status_code == 503, asked.json()
    outbox = asked.json()["checks"]["outbox"]
    assert not outbox["ok"]
    assert outbox["failing"]["default"] == f"could not read the outbox: OperationalError: {down}"
    assert full.status_code == 503 and not full.json()["checks"]["outbox"]["ok"]
    assert client.get(URL, {"check": "outbox"}).status_code == 200  # reachable again


def test_an_outbox_table_missing_everywhere_fails_the_outbox_check(client, queues):
    """Migrations not run: no database has the outbox table, so a commit while Redis is down
    has nowhere to go. The check said nothing (left out) and a probe asking for it alone
    passed with nothing checked."""
    from django.db import connection

    from django_delayqueue.models import OutboxMessage

    for q in queues.values():
        beat(q)
    table = OutboxMessage._meta.db_table
    with connection.cursor() as cursor:  # rolled back with the test's transaction
        cursor.execute(f"DROP TABLE {connection.ops.quote_name(table)}")
    asked = client.get(URL, {"check": "outbox"})
    full = client.get(URL)
    assert asked.status_code == 503, asked.json()
    outbox = asked.json()["checks"]["outbox"]
    assert not outbox["ok"] and outbox["databases"] == {}
    assert outbox["failing"] == {"default": f"the outbox table {table!r} is missing: run migrate"}
    assert full.status_code == 503 and full.json()["checks"]["outbox"] == outbox


class NoOutbox:
    """A router that lets no database hold this app's tables."""

    def allow_migrate(self, db, app_label, **hints):
        return False if app_label == "django_delayqueue" else None


def test_no_database_for_the_outbox_fails_a_probe_asking_for_it_alone(client, queues):
    for q in queues.values():
        beat(q)
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.NoOutbox"]):
        asked = client.get(URL, {"check": "outbox"})
        full = client.get(URL)
    assert asked.status_code == 503, asked.json()
    assert asked.json()["checks"]["outbox"]["failing"] == {
        "(none)": "no database may hold the outbox table (DATABASES, DATABASE_ROUTERS)"
    }
    assert full.status_code == 200 and "outbox" not in full.json()["checks"]
