"""``manage.py queuestats``: the numbers of the admin's "Delay queues" page, in a terminal."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.monitoring.stats import QueueStats, collect, format_seconds

COLUMNS = (
    ("QUEUE", lambda s: s.queue),
    ("PENDING", lambda s: s.counts["pending"]),
    ("READY", lambda s: s.counts["ready"]),
    ("UNACK", lambda s: s.counts["unack"]),
    ("RETRY", lambda s: s.counts["retry"]),
    ("GARBAGE", lambda s: s.counts["garbage"]),
    ("OVERDUE", lambda s: _overdue(s)),
    ("CONSUMERS", lambda s: s.consumers_alive),
    ("PAUSED", lambda s: None if s.paused is None else ("yes" if s.paused else "no")),
    ("DELIVERED", lambda s: s.deliveries),
    ("FAILED", lambda s: s.failures),
)


class Command(BaseCommand):
    help = (
        "Show per queue how many messages are pending, ready, in flight (unack), retrying and "
        "dead (garbage), how late the oldest due one is, live consumers, and delivery totals."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="default: all queues")
        parser.add_argument(
            "--json", action="store_true", help="one JSON document (a line per refresh)"
        )
        parser.add_argument(
            "--watch",
            type=_positive_float,
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
        if as_json:
            document = {"time": now, "queues": [s.to_dict() for s in stats]}
            # One line per refresh in watch mode (JSON lines), readable indentation otherwise.
            self.stdout.write(json.dumps(document, indent=None if watching else 2))
        else:
            if watching:
                self.stdout.write(f"\n{now}")
            self.stdout.write(render_table(stats))
        errors = sorted({e for s in stats for e in s.errors})
        for error in errors:
            self.stderr.write(f"error: {error}")
        return "; ".join(errors)


def render_table(stats: Sequence[QueueStats]) -> str:
    """A plain text table, numbers right-aligned, ``-`` for what could not be read."""
    rows = [[_cell(get(s)) for _, get in COLUMNS] for s in stats]
    header = [name for name, _ in COLUMNS]
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    if not stats:
        lines.append("(no queues configured)")
    return "\n".join(lines)


def _overdue(s: QueueStats) -> str | None:
    if s.counts["pending"] is None:  # not read
        return None
    return "0" if s.oldest_overdue_seconds is None else format_seconds(s.oldest_overdue_seconds)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError(value)
    return number
