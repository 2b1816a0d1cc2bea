"""Security basics: JSON-only payloads, Redis over TLS and with an ACL user, key prefixes that
keep two sites apart on one Redis, and bounded, validated sizes.

(The admin's permission matrix lives in tests/test_admin.py, next to the admin.)
"""

from __future__ import annotations

import ast
import datetime
import ipaddress
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import django_delayqueue
from django_delayqueue.core import (
    ConfigurationError,
    DelayQueueError,
    ManualClock,
    PayloadError,
    Queue,
    QueueSettings,
    RedisUnavailable,
)
from django_delayqueue.core.consumer import Consumer
from django_delayqueue.redis_server import RedisServerProcess, free_port

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


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA) and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "delayqueue test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "redis.crt", directory / "redis.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[RedisServerProcess, int, Path]]:
    cert, key = _self_signed(tmp_path)
    tls_port = free_port()
    args = ("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    args += ("--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no")
    with RedisServerProcess(args=args) as server:
        yield server, tls_port, cert


def test_schedule_claim_ack_over_tls(tls_server: tuple[RedisServerProcess, int, Path]) -> None:
    _, tls_port, cert = tls_server
    client = redis.Redis.from_url(f"rediss://127.0.0.1:{tls_port}/0", ssl_ca_certs=str(cert))
    q = Queue(client, "orders")  # the Redis clock too goes over TLS
    scheduled = q.schedule({"order": 42})
    (message,) = q.claim()
    assert (message.id, message.payload) == (scheduled.id, {"order": 42})
    assert q.ack(message) == 1 and sum(q.counts().values()) == 0
    # A client that does not trust the certificate is refused, with a clear error.
    untrusting = redis.Redis.from_url(f"rediss://127.0.0.1:{tls_port}/0", socket_timeout=5)
    with pytest.raises(RedisUnavailable, match=r"(?i)certificate"):
        Queue(untrusting, "orders", clock=ManualClock()).schedule({"order": 43})


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
