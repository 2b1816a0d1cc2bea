"""``manage.py runqueue``: deliver due messages to the queues' signal handlers."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayqueue.conf.queues import configured
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.management.logs import configure_logging
from django_delayqueue.management.seconds import checked_seconds, seconds_type
from django_delayqueue.mirror.following import sync_settings
from django_delayqueue.monitoring.servers import ServerGuard
from django_delayqueue.worker import Worker


class Command(BaseCommand):
    help = (
        "Deliver due messages of the configured delay queues (or only the QUEUEs named) to "
        "their handlers. Sleeps until the next due time. Runs --processes consumer processes "
        "(default 1) under this supervising process, which replaces a process that dies and "
        "recycles one past --max-messages-per-child or --max-memory-per-child. SIGTERM/SIGINT "
        "finish in-flight handlers (within --grace) and exit 0 (1 if a process did not stop "
        "cleanly), a second signal stops at once; SIGHUP replaces the processes one by one, "
        "each once its successor consumes, with fresh interpreters that run the code on disk "
        "(a deploy without a gap). "
        "--burst (and a call from a thread other than the main one) delivers in this process "
        "alone. Also relays the outbox: messages committed while Redis was down are sent when "
        "it is back. Refuses a Redis whose maxmemory-policy evicts keys (docs/redis.md)."
    )

    # The command line this command was run from (None: call_command): SIGHUP runs it again.
    _argv: list[str] | None = None

    def run_from_argv(self, argv: list[str]) -> None:
        self._argv = list(argv)
        super().run_from_argv(argv)

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
            type=seconds_type(zero=True),
            default=30.0,
            metavar="SECONDS",
            help="on SIGTERM, time in-flight handlers get to finish (default 30; 0 or more)",
        )
        parser.add_argument(
            "--name",
            help=(
                "name of this runqueue (default: runqueue-<host>-<pid>): each consumer "
                "process is NAME.<slot>-<pid> in heartbeats and logs, and a task's worker_ids "
                "list NAME"
            ),
        )
        parser.add_argument(
            "-p",
            "--processes",
            type=_positive,
            default=1,
            metavar="N",
            help="consumer processes, each with its handler threads per queue (default 1)",
        )
        parser.add_argument(
            "--max-messages-per-child",
            type=_positive,
            metavar="M",
            help="replace a consumer process once it handled M messages (no gap in service)",
        )
        parser.add_argument(
            "--alive-file",
            metavar="PATH",
            help=(
                "touch PATH each time a consumer loop goes round (at most once a second, "
                "also while Redis is down): a liveness probe checks its age with "
                "'python -m django_delayqueue.alive PATH --max-age 60'"
            ),
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=_positive,
            metavar="MB",
            help=(
                "replace a consumer process once its resident memory exceeds MB megabytes "
                "(refused below what every consumer process starts with)"
            ),
        )

    def handle(self, *queues: str, **options: Any) -> None:
        configure_logging(options["verbosity"])
        # call_command(grace=...) hands the value over unparsed: checked here as well.
        options["grace"] = checked_seconds("--grace", options["grace"], zero=True)
        if options["alive_file"]:
            _check_alive_file(options["alive_file"])
        from django_delayqueue.supervisor.fresh import take_child_invocation

        invocation = take_child_invocation()
        if invocation is not None:  # started by a supervisor after SIGHUP: one of its children
            from django_delayqueue.supervisor.child import run_child

            run_child(*invocation, ())
        in_process = options["burst"] or options["max_messages"] is not None
        if in_process and options["processes"] > 1:
            raise CommandError(
                "--burst and --max-messages deliver in this process: --processes N > 1 needs "
                "a runqueue that runs until stopped"
            )
        if in_process or threading.current_thread() is not threading.main_thread():
            # No signals to own off the main thread (call_command in a thread), and a burst
            # ends by itself: nothing to supervise.
            code = self._run_in_process(options)
        else:
            code = self._supervise(options)
        if code:
            raise CommandError(f"runqueue stopped with exit code {code}", returncode=code)

    def _run_in_process(self, options: dict[str, Any]) -> int:
        try:
            worker = Worker.for_queues(
                options["queues"] or None,
                burst=options["burst"],
                max_messages=options["max_messages"],
                grace_seconds=options["grace"],
                name=options["name"],
                alive_file=options["alive_file"],
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
            return worker.run()
        finally:
            _restore_signal_handlers(previous)

    def _supervise(self, options: dict[str, Any]) -> int:
        from django_delayqueue.supervisor.fresh import restart_command
        from django_delayqueue.supervisor.loop import Supervisor, SupervisorOptions
        from django_delayqueue.supervisor.memory import memory_limit_problem, own_memory_bytes

        names = options["queues"] or None
        try:
            configured(names, tasks=True)  # a name that is not configured: said here, once
            sync_settings()
            # Judged once before any process starts: an evicting Redis is refused (exit 1),
            # never respawned for ever.
            ServerGuard().check()
        except ConfigurationError as e:
            raise CommandError(str(e)) from e
        if options["max_memory_per_child"] is not None:
            # Measured now, set up as a consumer process will be: a limit below it would
            # have every process replaced as soon as it started.
            problem = memory_limit_problem(options["max_memory_per_child"], own_memory_bytes())
            if problem:
                raise CommandError(problem)
        supervisor = Supervisor(
            SupervisorOptions(
                queues=list(names) if names else None,
                processes=options["processes"],
                concurrency=options["concurrency"],
                grace_seconds=options["grace"],
                max_messages_per_child=options["max_messages_per_child"],
                max_memory_per_child_mb=options["max_memory_per_child"],
                name=options["name"],
                alive_file=options["alive_file"],
                restart=restart_command(self._argv),
            )
        )
        code = supervisor.run()
        if supervisor.fatal is not None:
            raise CommandError(supervisor.fatal[0], returncode=supervisor.fatal[1])
        return code


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


def _check_alive_file(path: str) -> None:
    """Refuse at start an --alive-file that cannot be written (a liveness probe reading it
    would restart the worker for ever)."""
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise CommandError(f"--alive-file {path}: cannot be written ({e.strerror})") from e


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {value!r}")
    return number
