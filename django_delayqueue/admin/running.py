"""What the queue page shows of the consumer processes and the messages they run now.

From the heartbeat details (monitoring.processes): each live consumer process under its
supervisor, and, on the "In flight" tab, for each running message how long it has run, its
queue's ``time_limit``, the progress it reported (``message.progress``: percent and note) and
which process runs it. A message running past its limit is a
stalled slot: its row carries a red badge and the page a count at the top.
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.progress import Progress
from django_delayqueue.monitoring.processes import by_supervisor, past_limit
from django_delayqueue.monitoring.stats import QueueStats, format_seconds


def processes_context(stats: QueueStats) -> list[dict[str, Any]]:
    """Each supervisor (None: processes not supervised) with its consumer processes."""
    running: dict[str, int] = {}
    for p in stats.processes:
        running[p.name] = running.get(p.name, 0) + p.running_count
    return [
        {
            "supervisor": label,
            "processes": [
                {
                    "name": p.name,
                    "pid": p.pid,
                    "host": p.host,
                    "handled": p.handled,
                    "memory": None if p.rss_bytes is None else f"{p.rss_bytes / 1024**2:.0f} MB",
                    "running": running.get(p.name, 0),
                    "seen": format_seconds(max(0, stats.now_ms - p.last_seen_ms) / 1000),
                }
                for p in group
            ],
        }
        for label, group in by_supervisor(stats.processes).items()
    ]


def stalled_ids(stats: QueueStats, time_limit: float | None) -> set[str]:
    """The messages of the queue that run past ``time_limit``."""
    return {r.id for r in past_limit(stats.running, time_limit, stats.now_ms)}


def annotate_running(
    rows: list[dict[str, Any]], stats: QueueStats, time_limit: float | None
) -> None:
    """Add ``running`` to each in-flight row whose handler runs now (per the heartbeats)."""
    now = {r.id: r for r in stats.running}
    stalled = stalled_ids(stats, time_limit)
    for row in rows:
        r = now.get(row["id"])
        if r is None:
            row["running"] = None
            continue
        row["running"] = {
            "for": format_seconds(r.running_seconds(stats.now_ms)),
            "limit": "—" if time_limit is None else format_seconds(time_limit),
            "consumer": r.consumer,
            "pid": r.pid,
            "stalled": r.id in stalled,
            "progress": None if r.progress is None else _progress(r.progress),
        }


def _progress(p: Progress) -> dict[str, Any]:
    """What the Progress column shows: a bar, its percent ("42.5%") and the note."""
    return {"percent": p.percent, "label": f"{p.percent:g}%", "note": p.note, "at": p.at}
