"""The Redis servers the app uses, and what is wrong with them: the one place that judges.

The system checks, ``runqueue``, the health probe, the admin, ``queuestats`` and the metrics
all read the servers here (:func:`app_servers`: the one server, the Sentinel primary, or every
cluster primary) and judge them with :func:`findings`:

- a ``maxmemory-policy`` other than ``noeviction``: Redis deletes keys, and with them
  messages, when its memory is full. ``runqueue`` refuses to start on such a server unless
  ``DELAYQUEUE['ACCEPT_DATA_LOSS_ON_EVICTION']`` is True (then it warns at every start);
- no AOF and no RDB snapshots: a restart empties every queue (not said of the embedded server
  of the demo and the tests, nor where CONFIG is disabled and snapshots cannot be seen);
- memory used past ``HEALTH_MAX_MEMORY_PERCENT`` of ``maxmemory`` (the health probe, opt-in).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.cluster import RedisCluster

from django_delayqueue.conf.connection import get_client
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.server_info import NOEVICTION, ServerInfo, address_of, read_servers

logger = logging.getLogger(__name__)

ACCEPT = "ACCEPT_DATA_LOSS_ON_EVICTION"
EVICTING, EVICTING_ACCEPTED, NOT_PERSISTENT = "evicting", "evicting-accepted", "not-persistent"
# The system check id of each kind (checks.servers).
CHECK_IDS = {
    EVICTING: "delayqueue.E010",
    EVICTING_ACCEPTED: "delayqueue.W007",
    NOT_PERSISTENT: "delayqueue.W006",
}
DOC = "docs/redis.md of django-delayqueue"


@dataclass(frozen=True)
class Finding:
    """Something wrong with one server: ``kind`` is one of the constants above."""

    server: str
    kind: str
    message: str
    hint: str

    @property
    def refuses_runqueue(self) -> bool:
        """Whether ``runqueue`` refuses to start on it (an evicting policy not accepted)."""
        return self.kind == EVICTING


def app_servers(client: Any = None) -> list[ServerInfo]:
    """Every server the app writes to (``client`` default: the app's own). Never raises."""
    if client is None:
        try:
            client = get_client()
        except ConfigurationError as e:  # reported by the checks (E004)
            return [ServerInfo("(Redis not configured)", error=str(e))]
        except Exception as e:  # a cluster client connects as it is built: down
            return [ServerInfo("(Redis cluster)", error=str(e), unreachable=True)]
    return read_servers(client)


def unreachable_servers(error: str) -> list[ServerInfo]:
    """The servers when Redis does not answer (``error``), named without asking them."""
    try:
        client = get_client()
    except Exception:  # not configured, or a cluster that cannot connect: one entry
        return [ServerInfo("(Redis)", error=error, unreachable=True)]
    if isinstance(client, RedisCluster):
        return [ServerInfo("cluster", error=error, unreachable=True)]
    return [ServerInfo(address_of(client), error=error, unreachable=True)]


def eviction_accepted() -> bool:
    """Whether the operator accepts messages lost to eviction (exactly True, nothing else)."""
    return dq_settings.ACCEPT_DATA_LOSS_ON_EVICTION is True


def findings(servers: list[ServerInfo]) -> list[Finding]:
    """What is wrong with ``servers`` (those read without an error). A server that keeps
    nothing is not mentioned when its check is in ``SILENCED_SYSTEM_CHECKS`` (the eviction
    policy is accepted only by its own setting)."""
    silenced = CHECK_IDS[NOT_PERSISTENT] in getattr(settings, "SILENCED_SYSTEM_CHECKS", [])
    out: list[Finding] = []
    for s in servers:
        if not s.ok:
            continue
        if s.evicts:
            out.append(_eviction(s))
        if s.persistent is False and not s.embedded and not silenced:
            out.append(
                Finding(
                    s.address,
                    NOT_PERSISTENT,
                    f"Redis {s.address} keeps nothing on disk (no AOF, no RDB snapshots): a "
                    "restart or a crash empties every queue.",
                    "Set appendonly yes with appendfsync everysec (a crash loses at most about "
                    "a second of writes) or always, or RDB snapshots (save) at the least; see "
                    f"{DOC}. For a server that may lose everything, silence it with "
                    "SILENCED_SYSTEM_CHECKS = ['delayqueue.W006'].",
                )
            )
    return out


def _eviction(s: ServerInfo) -> Finding:
    accepted = eviction_accepted()
    message = (
        f"Redis {s.address} has maxmemory-policy {s.policy}: when its memory is full it deletes "
        "keys, and with them scheduled messages, without an error to anyone."
    )
    if accepted:
        return Finding(
            s.address,
            EVICTING_ACCEPTED,
            message + f" Accepted by DELAYQUEUE[{ACCEPT!r}].",
            f"Set maxmemory-policy {NOEVICTION} to lose nothing; see {DOC}.",
        )
    return Finding(
        s.address,
        EVICTING,
        message,
        f"Set maxmemory-policy {NOEVICTION} on this server (redis.conf, CONFIG SET, or your "
        "provider's parameter group) with a maxmemory that holds the backlog: a full server "
        f"then refuses new messages (dq.RedisOutOfMemory) instead of deleting some. runqueue "
        f"will not start until then, unless DELAYQUEUE[{ACCEPT!r}] = True; see {DOC}.",
    )


def memory_problems(servers: list[ServerInfo], percent: float) -> dict[str, str]:
    """Servers whose used memory is past ``percent`` of their maxmemory, or already full."""
    out: dict[str, str] = {}
    for s in servers:
        used = s.memory_percent
        if s.out_of_memory:
            out[s.address] = f"out of memory: writes are refused ({used:.0f}% of maxmemory)"
        elif used is not None and used >= percent:
            out[s.address] = f"{used:.0f}% of maxmemory used"
    return out


def format_bytes(size: int | None) -> str:
    """A short human size ("950 B", "1.2 MB", "3.0 GB"); "—" when not known."""
    if size is None:
        return "—"
    value = float(size)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def memory_text(s: ServerInfo) -> str:
    """``used_memory`` against ``maxmemory``: "1.2 MB of 100.0 MB (1%)", or "1.2 MB (no
    maxmemory)"."""
    used = format_bytes(s.used_memory)
    if not s.maxmemory:
        return f"{used} (no maxmemory)"
    return f"{used} of {format_bytes(s.maxmemory)} ({s.memory_percent or 0:.0f}%)"


class ServerGuard:
    """What ``runqueue`` checks of its Redis servers before it delivers: once they answer
    (a Redis down at start is checked when it is back), never again."""

    def __init__(self, client: Any = None) -> None:
        self.client = client
        self.verified = False

    def check(self) -> None:
        """Read the servers if not done yet: raise ConfigurationError for one whose policy
        evicts (unless accepted: then a warning, as for a server that keeps nothing)."""
        if self.verified:
            return
        servers = app_servers(self.client)
        down = [s for s in servers if s.unreachable]
        if down:
            logger.debug("Redis servers not checked yet (%s): again later", down[0].error)
            return
        self.verified = True
        for s in servers:
            if not s.ok:  # INFO refused (an ACL, say): nothing to judge, said once
                logger.warning(
                    "Redis %s: eviction policy and persistence not checked: %s", s.address, s.error
                )
        found = findings(servers)
        for f in found:
            if not f.refuses_runqueue:
                logger.warning("%s %s", f.message, f.hint)
        refused = [f for f in found if f.refuses_runqueue]
        if refused:
            raise ConfigurationError(" ".join(f"{f.message} {f.hint}" for f in refused))
