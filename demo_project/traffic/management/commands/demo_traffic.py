"""``manage.py demo_traffic``: play the demo shop's customers (traffic/generator.py)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from demo_project.traffic.generator import Traffic


class Command(BaseCommand):
    help = (
        "Play the demo shop's customers: orders (paid or left to close), stores and their "
        "SMS, campaigns, exports. Runs until Ctrl-C or SIGTERM."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, help="stop after this many seconds")
        parser.add_argument("--seed", type=int, default=38, help="of the random choices")

    def handle(self, *args: Any, **options: Any) -> None:
        traffic = Traffic(seed=options["seed"])
        traffic.install_signal_handlers()
        done = traffic.run(options["seconds"])
        self.stdout.write(f"demo traffic: {done} actions")
