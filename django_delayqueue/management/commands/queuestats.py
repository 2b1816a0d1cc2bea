"""``manage.py queuestats``: the numbers of the admin's "Delay queues" page, in a terminal."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.server_info import ServerInfo
from django_delayqueue.management.seconds import checked_seconds, seconds_type
from django_delayqueue.monitoring.processes import by_supervisor, merge_processes
from django_delayqueue.monitoring.recurrences import RecurrenceStatus, configured_statuses
from django_delayqueue.monitoring.servers import app_servers, findings, memory_text
from django_delayqueue.monitoring.stats import QueueStats, collect, format_seconds

COLUMNS = (
    ("QUEUE", lambda s: s.queue),
    ("PENDING", lambda s: s.counts["pending"]),
    ("READY", lambda s: s.counts["ready"]),
    ("UNACK", lambda s: s.counts["unack"]),
    ("RETRY", lambda s: s.counts["retry"]),
    ("DEAD", lambda s: s.counts["garbage"]),
    ("OVERDUE", lambda s: _overdue(s)),
    ("CONSUMERS", lambda s: s.consumers_alive),
    ("PAUSED", lambda s: None if s.paused is None else ("yes" if s.paused else "no")),
    ("DELIVERED", lambda s: s.deliveries),
    ("FAILED", lambda s: s.failures),
    # Of DELIVERED, the deliveries an atomic queue found already done (docs/exactly-once.md).
    ("ALREADY_DONE", lambda s: s.already_done),
)


class Command(BaseCommand):
    help = (
        "Show per queue how many messages are pending, ready, in flight (unack), retrying and "
        "dead, how late the oldest due one is, live consumers, and delivery totals; "
        "then the flow limits (rate, in-flight cap, per-key limits, how many wait on them, "
        "throttled) and the busiest flow keys (ready + in flight, the top 10); then "
        "how late handlers start (p50/p99 over the last 5 minutes and hour); then "
        "each recurring schedule's next run, last run and its outcome; then each Redis "
        "server's memory (used against maxmemory), eviction policy and persistence."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="default: all queues")
        parser.add_argument(
            "--json", action="store_true", help="one JSON document (a line per refresh)"
        )
        parser.add_argument(
            "--watch",
            type=seconds_type(zero=False),
            metavar="SECONDS",
            help="refresh every SECONDS until interrupted",
        )
        parser.add_argument(
            "--count",
            type=int,
            metavar="N",
            help="with --watch: stop after N refreshes",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["queues"] or None
        watch, count = options["watch"], options["count"]
        if watch is not None:  # call_command(watch=...) hands the value over unparsed
            watch = checked_seconds("--watch", watch, zero=False)
        shown = 0
        try:
            while True:
                failed = self._show(names, options["json"], watch is not None)
                shown += 1
                if watch is None:
                    if failed:
                        raise CommandError(f"could not read every queue: {failed}")
                    return
                if count is not None and shown >= count:
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            return

    def _show(self, names: list[str] | None, as_json: bool, watching: bool) -> str:
        try:
            stats = collect(names)
        except ConfigurationError as e:
            raise CommandError(str(e)) from e
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        schedules = [s for s in configured_statuses() if names is None or s.queue in names]
        servers = app_servers()
        if as_json:
            document = {
                "time": now,
                "queues": [s.to_dict() for s in stats],
                "schedules": [s.to_dict() for s in schedules],
                "servers": [s.to_dict() for s in servers],
            }
            # One line per refresh in watch mode (JSON lines), readable indentation otherwise.
            self.stdout.write(json.dumps(document, indent=None if watching else 2))
        else:
            if watching:
                self.stdout.write(f"\n{now}")
            self.stdout.write(render_table(stats))
            if any(st.flow.limited for st in stats):
                self.stdout.write("\n" + render_flow(stats))
            if any(st.busiest_keys and st.busiest_keys.keys for st in stats):
                self.stdout.write("\n" + render_keys(stats))
            if any(_watched(st) for st in stats):
                self.stdout.write("\n" + render_lateness(stats))
            for st in stats:
                if st.lateness is not None and st.lateness.flagged:
                    self.stderr.write(
                        f"warning: queue {st.queue}: p99 start lateness over the last 5 minutes "
                        f"above its lateness_warning_ms ({st.lateness.warning_ms:g} ms)"
                    )
            for st in stats:  # messages left for a newer consumer, consumers behind this one
                formats = st.formats
                for text in (formats.waiting_text(), formats.older_text()) if formats else ():
                    if text:
                        self.stderr.write(f"warning: queue {st.queue}: {text}")
            if any(st.processes for st in stats):
                self.stdout.write("\n" + render_processes(stats))
            if schedules:
                self.stdout.write("\n" + render_schedules(schedules))
            self.stdout.write("\n" + render_servers(servers))
            for finding in findings(servers):
                self.stderr.write(f"warning: {finding.message}")
        if not as_json:
            for text in sorted({f for s in stats for f in s.start_failures}):
                named = ", ".join(s.queue for s in stats if text in s.start_failures)
                self.stderr.write(f"error: {text} (queues: {named})")
        errors = sorted({e for s in stats for e in s.errors})
        for error in errors:
            self.stderr.write(f"error: {error}")
        return "; ".join(errors)


FLOW_COLUMNS = (
    ("QUEUE", lambda s: s.queue),
    ("RATE LIMIT", lambda s: s.flow.rate_limit),
    ("MAX IN FLIGHT", lambda s: s.flow.max_in_flight),
    ("RATE NOW", lambda s: None if s.flow.rate_now is None else f"{s.flow.rate_now:g}/s"),
    ("WAITING", lambda s: s.flow.waiting),
    ("HELD BY", lambda s: (s.flow.held or "").replace("_", " ") or None),
    ("THROTTLED", lambda s: s.flow.throttled),
    ("PER KEY", lambda s: _per_key(s.flow)),
    ("ON KEYS", lambda s: s.flow.waiting_on_keys if s.flow.key_limited else None),
)


LATENESS_COLUMNS = (
    ("QUEUE", lambda s: s.queue),
    ("LATENESS 5 MIN", lambda s: s.lateness and s.lateness.text_5m),
    ("LATENESS 1 H", lambda s: s.lateness and s.lateness.text_1h),
    ("WARN AT", lambda s: s.lateness and s.lateness.warning_ms and f"{s.lateness.warning_ms:g} ms"),
    ("LATE", lambda s: "YES" if s.lateness is not None and s.lateness.flagged else None),
)


def render_lateness(stats: Sequence[QueueStats]) -> str:
    """How late handlers start (p50/p99 of handler start minus due time, from the consumers'
    histograms, interpolated inside a bucket), and the queues flagged past their warning: the
    queues with deliveries in the last hour or a ``lateness_warning_ms``."""
    return _table([s for s in stats if _watched(s)], LATENESS_COLUMNS, left=1)


def _watched(s: QueueStats) -> bool:
    late = s.lateness
    return late is not None and (late.warning_ms is not None or bool(late.windows.last_hour))


def _per_key(flow: Any) -> str | None:
    """The key limits: "1/s, 1 in flight"."""
    cap = None if flow.key_concurrency is None else f"{flow.key_concurrency} in flight"
    return ", ".join(p for p in (flow.key_rate_limit, cap) if p) or None


def render_flow(stats: Sequence[QueueStats]) -> str:
    """The queues with flow limits: the limits, messages started in the last second, how many
    wait on a limit (and which), how many it throttled in all (docs/flow-control.md)."""
    return _table([s for s in stats if s.flow.limited], FLOW_COLUMNS, left=1)


KEY_COLUMNS = (
    ("QUEUE", lambda row: row[0]),
    ("KEY", lambda row: row[1].key if row[1].key.isprintable() else repr(row[1].key)),
    ("READY", lambda row: row[1].ready),
    ("IN FLIGHT", lambda row: row[1].in_flight),
)


def render_keys(stats: Sequence[QueueStats]) -> str:
    """The busiest flow keys of each queue (ready + in flight), then what they were found among
    (every key with messages: monitoring/busiest_keys.py)."""
    rows = [(s.queue, k) for s in stats if s.busiest_keys for k in s.busiest_keys.keys]
    notes = [
        f"{s.queue}: busiest keys {s.busiest_keys.summary()}"
        for s in stats
        if s.busiest_keys and s.busiest_keys.keys
    ]
    return _table(rows, KEY_COLUMNS, left=2) + "\n" + "\n".join(notes)


SCHEDULE_COLUMNS = (
    ("SCHEDULE", lambda s: s.name),
    ("QUEUE", lambda s: s.queue),
    ("WHEN", lambda s: s.when),
    ("NEXT RUN", lambda s: _next_run(s)),
    ("LAST RUN", lambda s: _instant(s.last_tick_ms)),
    ("OUTCOME", lambda s: s.last_outcome or None),
    ("PAUSED", lambda s: "yes" if s.paused else "no"),
)


SERVER_COLUMNS = (
    ("REDIS SERVER", lambda s: s.address),
    ("VERSION", lambda s: s.version),
    ("MEMORY", lambda s: memory_text(s) if s.ok else None),
    ("POLICY", lambda s: s.policy),
    ("PERSISTENCE", lambda s: s.persistence if s.ok else None),
)


def render_servers(servers: Sequence[ServerInfo]) -> str:
    """Each Redis server: memory used against maxmemory, eviction policy, persistence."""
    return _table(servers, SERVER_COLUMNS, left=1)


def render_schedules(schedules: Sequence[RecurrenceStatus]) -> str:
    """The recurring schedules: next and last run (UTC) and the last outcome."""
    return _table(schedules, SCHEDULE_COLUMNS, left=3)


def _next_run(s: RecurrenceStatus) -> str | None:
    if s.error:
        return f"error: {s.error[:60]}"
    if s.next_run_ms is None:
        return None
    text = _instant(s.next_run_ms)
    return text if s.next_is_waiting else f"{text} (not yet scheduled)"


def _instant(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def render_table(stats: Sequence[QueueStats]) -> str:
    """A plain text table, numbers right-aligned, ``-`` for what could not be read."""
    text = _table(stats, COLUMNS, left=1)
    return text if stats else text + "\n(no queues configured)"


PROCESS_COLUMNS = (
    ("SUPERVISOR", lambda r: r[0]),
    ("CONSUMER", lambda r: r[1].name),
    ("PID", lambda r: r[1].pid),
    ("HOST", lambda r: r[1].host),
    ("HANDLED", lambda r: r[1].handled),
    ("MEMORY", lambda r: None if r[1].rss_bytes is None else f"{r[1].rss_bytes / 1024**2:.0f} MB"),
    ("RUNNING", lambda r: r[2]),
)


def render_processes(stats: Sequence[QueueStats]) -> str:
    """Each live consumer process once (over every queue), under its supervisor, with what it
    runs now ("queue:id for 3 s at 40%: note", longest first)."""
    now = max(st.now_ms for st in stats)
    merged = merge_processes([st.processes for st in stats])
    running: dict[str, list[str]] = {}
    for r in sorted((r for st in stats for r in st.running), key=lambda r: r.started_ms):
        text = f"{r.queue}:{r.id} for {format_seconds(r.running_seconds(now))}"
        if r.progress is not None:  # what it reported (message.progress): "at 42%: row 4000"
            note = f": {r.progress.note}" if r.progress.note else ""
            text += f" at {r.progress.percent:g}%{note}"
        running.setdefault(r.consumer, []).append(text)
    rows = [
        (label or "-", p, ", ".join(running.get(p.name, [])[:3]) or "idle")
        for label, group in by_supervisor(merged).items()
        for p in group
    ]
    return _table(rows, PROCESS_COLUMNS, left=4)


def _table(items: Sequence[Any], columns: Any, left: int) -> str:
    """Rows of ``columns`` (name, getter); the first ``left`` columns aligned left."""
    rows = [[_cell(get(s)) for _, get in columns] for s in items]
    header = [name for name, _ in columns]
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _overdue(s: QueueStats) -> str | None:
    if s.counts["pending"] is None:  # not read
        return None
    return "0" if s.oldest_overdue_seconds is None else format_seconds(s.oldest_overdue_seconds)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
