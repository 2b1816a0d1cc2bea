"""``runqueue`` with a stand-in for the time-limit watchdog, for the supervisor's drills.

Run as ``python tests/support/programs/limited_runqueue.py [runqueue options] [QUEUE ...]``
with the drill settings (``DJANGO_SETTINGS_MODULE=drill_settings``). The supervisor, its
children and ``runqueue``'s options are the real ones; only the consumer in each child is
:class:`LimitedWorker`: on each round it looks for a handler past its queue's ``time_limit``
and, as the real watchdog does once a handler cannot be stopped, reports it through
``Consumer.replacement_needed`` and stops as on SIGTERM. What the supervisor does then (a
replacement at once, the stopped message settled once the old process is gone) is under test.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import django

django.setup()

from django.core.management import call_command  # noqa: E402

from django_delayqueue.core.consumer.stopped import StoppedHandler, time_limit_reason  # noqa: E402
from django_delayqueue.supervisor import loop  # noqa: E402
from django_delayqueue.supervisor.child import SupervisedWorker  # noqa: E402


class LimitedWorker(SupervisedWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reported: set[str] = set()

    def step(self, now_ms: int | None = None) -> int:
        claimed = super().step(now_ms)
        over = []
        for running in self.running_handlers():
            q = self._by_name[running.message.queue]
            limit = q.settings.time_limit
            if limit is None or running.message.token in self._reported:
                continue
            if time.monotonic() - running.started_monotonic > limit:
                self._reported.add(running.message.token)
                over.append(StoppedHandler.of(running.message, "retry", time_limit_reason(limit)))
        if over and not self.stopping:
            self.replacement_needed(over)
            self.request_stop()
        return claimed


class LimitedSupervisor(loop.Supervisor):
    def __init__(self, options: loop.SupervisorOptions, worker_class: Any = None) -> None:
        super().__init__(options, LimitedWorker)


loop.Supervisor = LimitedSupervisor  # type: ignore[misc]  # what runqueue builds

if __name__ == "__main__":
    call_command("runqueue", *sys.argv[1:])
