"""A Redis Sentinel group of our own for the failover drill: a primary, a replica and three
sentinels (the Debian ``redis-server`` runs a sentinel with ``--sentinel``), all on free ports of
127.0.0.1, every process ours and stopped by PID."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import redis

from django_delayqueue.embedded import RedisServerProcess, find_redis_server, free_port

SERVICE = "mymaster"


class SentinelGroup:
    def __init__(self, down_after_ms: int = 1000, failover_timeout_ms: int = 4000) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dq-sentinel-"))
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.primary = RedisServerProcess()
        self.replica: RedisServerProcess | None = None
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.sentinel_ports: list[int] = []

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica = RedisServerProcess(
            args=("--replicaof", "127.0.0.1", str(self.primary.port))
        ).start()
        self._wait(lambda: self._replica_synced(self.primary.port), 20, "the replica to sync")
        binary = find_redis_server()
        for n in range(3):
            port = free_port()
            conf = self.dir / f"sentinel-{n}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            log = open(self.dir / f"sentinel-{n}.log", "wb")  # noqa: SIM115
            self.sentinels.append(
                subprocess.Popen(
                    [binary, str(conf), "--sentinel"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            log.close()
            self.sentinel_ports.append(port)
        self._wait(self._sentinels_see_everything, 30, "the sentinels to find each other")
        return self

    @property
    def hosts(self) -> list[list[object]]:
        return [["127.0.0.1", port] for port in self.sentinel_ports]

    def master_port(self) -> int | None:
        """The primary's port as a sentinel says (None: no sentinel answers)."""
        for port in self.sentinel_ports:
            try:
                client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
                addr = client.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
                client.close()
                if addr:
                    return int(addr[1])
            except redis.RedisError:
                continue
        return None

    def _sentinels_see_everything(self) -> bool:
        for port in self.sentinel_ports:
            try:
                client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
                master = client.execute_command("SENTINEL", "master", SERVICE)
                client.close()
            except redis.RedisError:
                return False
            # redis-py parses the reply into a dict; older ones may give the flat list.
            if isinstance(master, dict):
                info = master
            else:
                info = dict(zip(master[::2], master[1::2], strict=False))
            if int(info.get("num-other-sentinels", 0)) < 2 or int(info.get("num-slaves", 0)) < 1:
                return False
        return True

    @staticmethod
    def _replica_synced(primary_port: int) -> bool:
        client = redis.Redis(port=primary_port, socket_timeout=1)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return any(
            isinstance(v, dict) and v.get("state") == "online"
            for k, v in info.items()
            if k.startswith("slave")
        )

    @staticmethod
    def _wait(predicate: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.dir.glob("sentinel-*.log")))

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for server in (self.primary, self.replica):
            if server is not None:
                server.stop()
