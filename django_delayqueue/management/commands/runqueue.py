"""``manage.py runqueue``: deliver due messages to the queues' signal handlers."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.management.logs import configure_logging
from django_delayqueue.worker import Worker


class Command(BaseCommand):
    help = (
        "Deliver due messages of the configured delay queues (or only the QUEUEs named) to "
        "their handlers. Sleeps until the next due time; SIGTERM/SIGINT finish in-flight "
        "handlers (within --grace) and exit 0, a second signal exits at once. Also relays the "
        "outbox: messages committed while Redis was down are sent when it is back. Refuses a "
        "Redis whose maxmemory-policy evicts keys (docs/redis.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="default: all queues")
        parser.add_argument(
            "-c",
            "--concurrency",
            type=_positive,
            metavar="N",
            help=(
                "handler threads per queue (default: each queue's 'concurrency' setting, "
                "followed live when it is edited in the admin)"
            ),
        )
        parser.add_argument(
            "--burst", action="store_true", help="deliver what is due now, then exit 0"
        )
        parser.add_argument(
            "--max-messages", type=_positive, metavar="N", help="exit after N deliveries"
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="on SIGTERM, time in-flight handlers get to finish (default 30)",
        )
        parser.add_argument("--name", help="consumer name shown in heartbeats (default: random)")

    def handle(self, *queues: str, **options: Any) -> None:
        configure_logging(options["verbosity"])
        try:
            worker = Worker.for_queues(
                options["queues"] or None,
                burst=options["burst"],
                max_messages=options["max_messages"],
                grace_seconds=max(0.0, options["grace"]),
                name=options["name"],
            )
        except ConfigurationError as e:
            raise CommandError(str(e)) from e
        worker.sync_settings()
        # Start with what staff published (a paused queue stays paused), and judge the Redis
        # servers: one whose maxmemory-policy evicts keys is refused (docs/redis.md).
        worker.refresh()
        if worker.refused:
            raise CommandError(worker.refused)
        # None: each queue's own 'concurrency' setting, followed when staff edit it.
        worker.concurrency = options["concurrency"]
        previous = _install_signal_handlers(worker)
        try:
            code = worker.run()
        finally:
            _restore_signal_handlers(previous)
        if code:
            raise CommandError(f"runqueue stopped with exit code {code}", returncode=code)


def _install_signal_handlers(worker: Worker) -> dict[int, Any]:
    """Let SIGTERM/SIGINT stop the worker; return the handlers to put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # signal.signal only works in the main thread (e.g. call_command in a thread)
    previous: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    worker.install_signal_handlers()
    return previous


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {value!r}")
    return number
