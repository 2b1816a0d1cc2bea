"""The consumer processes behind a queue, as their heartbeats describe them.

Each consumer writes, with its heartbeat, a JSON value per queue (core.consumer.rounds.details): its
pid, host, supervisor, messages handled, resident memory and the handlers of that queue running
now. Here they are read back for the live consumers only (one HMGET per queue, bounded by
``MAX_CONSUMERS_LISTED``) and grouped under their supervisor, for ``queuestats``, the health
probe and the admin; with, in the same round trip, the progress the running messages reported
(the queue's ``progress`` hash: one entry per running message that reported, no more).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.core import DelayQueueError, Queue
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.formats import UNANNOUNCED_FORMAT, format_said
from django_delayqueue.core.progress import Progress, decode_progress
from django_delayqueue.core.scripts.calls import redis_errors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningNow:
    """A message a consumer process runs now (as of its last heartbeat)."""

    id: str
    queue: str
    consumer: str
    pid: int | None
    started_ms: int
    attempt: int = 1
    progress: Progress | None = None  # the last it reported (message.progress), if any

    def running_seconds(self, now_ms: int) -> float:
        return max(0, now_ms - self.started_ms) / 1000


@dataclass(frozen=True)
class ConsumerProcess:
    """One consumer (a process) on one queue; ``None``: its heartbeat carried no details (a
    consumer of an older version)."""

    name: str
    last_seen_ms: int
    pid: int | None = None
    host: str | None = None
    supervisor: dict[str, Any] | None = None
    handled: int | None = None
    rss_bytes: int | None = None
    running_count: int = 0
    running: list[RunningNow] = field(default_factory=list)
    # The newest envelope format it reads, as its heartbeat announced (1: announced none, a
    # release before formats had numbers; see core.formats).
    reads_format: int = UNANNOUNCED_FORMAT

    @property
    def supervisor_label(self) -> str | None:
        s = self.supervisor
        return None if not s else f"{s.get('name')} (pid {s.get('pid')})"

    def to_dict(self, now_ms: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "last_seen_seconds_ago": max(0, now_ms - self.last_seen_ms) / 1000,
            "pid": self.pid,
            "host": self.host,
            "supervisor": self.supervisor,
            "handled": self.handled,
            "rss_bytes": self.rss_bytes,
            "reads_format": self.reads_format,
            "running_count": self.running_count,
            "running": [
                {
                    "id": r.id,
                    "queue": r.queue,
                    "attempt": r.attempt,
                    "running_seconds": r.running_seconds(now_ms),
                    "progress": None if r.progress is None else r.progress.to_dict(),
                }
                for r in self.running
            ],
        }


def read_processes(
    queues: Sequence[Queue], consumers: Sequence[Sequence[tuple[str, int]]]
) -> list[list[ConsumerProcess]]:
    """What the heartbeats of the live ``consumers`` (name, last seen) of each of ``queues``
    (sharing one client) said; one round trip. Never raises: a consumer without details (an
    older version, or Redis down) is left out here, and listed by name in the stats."""
    plain: list[list[ConsumerProcess]] = [[] for _ in consumers]
    if not queues or not any(consumers):
        return plain
    try:
        pipe = queues[0].client.pipeline(transaction=False)
        for q, group in zip(queues, consumers, strict=True):
            pipe.hmget(q.keys.consumer_details, [n for n, _ in group] or ["-"])
            pipe.hgetall(q.keys.progress)
        with redis_errors("consumer details"):
            replies = pipe.execute(raise_on_error=False)
    except DelayQueueError as e:
        logger.debug("consumer details not read: %s", e)
        return plain
    out = []
    for i, (q, group) in enumerate(zip(queues, consumers, strict=True)):
        reply, progress = replies[2 * i], _progress(replies[2 * i + 1])
        values = reply if isinstance(reply, list) else [None] * len(group)
        parsed = [
            _parse(q.name, n, seen, v, progress)
            for (n, seen), v in zip(group, values, strict=False)
        ]
        out.append([p for p in parsed if p is not None])
    return out


def _progress(reply: Any) -> dict[str, Progress]:
    """A ``progress`` hash as read (an error: none), decoded, by id."""
    if not isinstance(reply, dict):
        return {}
    found = {to_str(i): decode_progress(v) for i, v in reply.items()}
    return {i: p for i, p in found.items() if p is not None}


def _parse(
    queue: str, name: str, seen: int, raw: Any, progress: Mapping[str, Progress]
) -> ConsumerProcess | None:
    if raw is None:
        return None
    try:
        data = json.loads(to_str(raw))
        pid = data.get("pid")
        running = [
            RunningNow(
                str(r["id"]),
                queue,
                name,
                pid,
                int(r["started_ms"]),
                int(r.get("attempt", 1)),
                progress.get(str(r["id"])),
            )
            for r in data.get("running") or []
        ]
        return ConsumerProcess(
            name,
            seen,
            pid=pid,
            host=data.get("host"),
            supervisor=data.get("supervisor"),
            handled=data.get("handled"),
            rss_bytes=data.get("rss_bytes"),
            running_count=int(data.get("running_count") or len(running)),
            running=running,
            reads_format=format_said(data.get("reads_format")),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def merge_processes(parts: Sequence[Sequence[ConsumerProcess]]) -> list[ConsumerProcess]:
    """A sharded queue's consumers from its shards': one entry per name, running summed."""
    by_name: dict[str, ConsumerProcess] = {}
    for group in parts:
        for p in group:
            seen = by_name.get(p.name)
            if seen is None:
                by_name[p.name] = p
                continue
            newest = p if p.last_seen_ms >= seen.last_seen_ms else seen
            by_name[p.name] = ConsumerProcess(
                p.name,
                newest.last_seen_ms,
                newest.pid,
                newest.host,
                newest.supervisor,
                newest.handled,
                newest.rss_bytes,
                seen.running_count + p.running_count,
                [*seen.running, *p.running],
                min(seen.reads_format, p.reads_format),
            )
    return sorted(by_name.values(), key=lambda p: -p.last_seen_ms)


def by_supervisor(
    processes: Sequence[ConsumerProcess],
) -> dict[str | None, list[ConsumerProcess]]:
    """Consumers grouped under their supervisor's label (None: not supervised)."""
    groups: dict[str | None, list[ConsumerProcess]] = {}
    for p in sorted(processes, key=lambda p: (p.supervisor_label or "", p.name)):
        groups.setdefault(p.supervisor_label, []).append(p)
    return groups


def supervisors_dict(processes: Sequence[ConsumerProcess]) -> list[dict[str, Any]]:
    """Each supervisor with its consumers' names (JSON)."""
    out = []
    for label, group in by_supervisor(processes).items():
        if label is None:
            continue
        s: Mapping[str, Any] = group[0].supervisor or {}
        out.append(
            {
                "name": s.get("name"),
                "pid": s.get("pid"),
                "host": group[0].host,
                "consumers": [p.name for p in group],
            }
        )
    return out


def past_limit(
    running: Sequence[RunningNow], time_limit: float | None, now_ms: int
) -> list[RunningNow]:
    """The messages that run past their queue's ``time_limit`` (a stalled slot)."""
    if time_limit is None:
        return []
    return [r for r in running if r.running_seconds(now_ms) > time_limit]
