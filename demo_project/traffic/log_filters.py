"""The demo's console: the failures it makes on purpose, in one line each."""

from __future__ import annotations

import logging

# Where the consumers log a handler's failure with its traceback (worker.py, the delivery of
# one message; core.consumer.outcomes, a BaseException such as TimeLimitExceeded).
HANDLER_FAILURES = ("django_delayqueue.worker", "django_delayqueue.core.consumer.outcomes")


class OneLineHandlerFailures(logging.Filter):
    """Drop the traceback of a handler's failure: the demo's gateway hangs and its partner
    fails on purpose, and the admin shows each failure with its reason. Other records (a
    real error of the demo) keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in HANDLER_FAILURES and record.exc_info:
            error = record.exc_info[1]
            record.msg = f"{record.msg}: %s"
            record.args = (*(record.args or ()), f"{type(error).__name__}: {error}")
            record.exc_info = None
            record.exc_text = None
        return True


class NoTimelineRequests(logging.Filter):
    """Leave out runserver's line for each refresh of the shop's timeline (every two seconds
    while the page is open)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "/timeline/" not in record.getMessage()
