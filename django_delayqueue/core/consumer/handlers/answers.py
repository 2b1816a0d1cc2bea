"""This process's answers to what a running handler asks about its delivery (core/running.py):
whether it was aborted (:func:`.limits.runs.aborted`) and keeping its progress reports
(:func:`.handlers.progress_reports.report_progress`).

Registered as this package is imported (its ``__init__``), so before any handler of it runs;
``Message.aborted`` and ``Message.progress`` reach them through core/running.py, and the
envelope imports nothing of the consumer.
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.consumer.handlers.progress_reports import report_progress
from django_delayqueue.core.consumer.limits.runs import aborted
from django_delayqueue.core.envelope import Message


class ConsumerAnswers:
    """The answers of every consumer of this process (the runs and reports are per process)."""

    def abort_requested(self, message: Message) -> bool:
        return aborted(message)

    def progress(self, message: Message, percent: Any, note: Any) -> bool:
        return report_progress(percent, note, message)


ANSWERS = ConsumerAnswers()
