"""The one way the suite waits for something: poll a condition up to a generous deadline.

The deadline is a bound against hangs, never a timing check: a test passes as soon as the
condition holds, and fails only when something is broken (or the machine is stuck for the whole
bound). The failure is an ``AssertionError`` naming what was awaited, so callers that add
context (a consumer's log) can catch it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 20.0  # the default bound: only reached when something is broken


def wait_until(
    condition: Callable[[], T],
    timeout: float = TIMEOUT,
    what: str = "the condition",
    every: float = 0.02,
    details: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    After ``timeout`` seconds: ``AssertionError`` naming ``what``, with ``details()`` appended
    (e.g. the log of the process under test).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout}s waiting for {what}"
            raise AssertionError(f"{message}:\n{details()}" if details else message)
        time.sleep(every)
