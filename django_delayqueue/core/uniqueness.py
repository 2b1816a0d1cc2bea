"""Uniqueness windows: ``schedule(..., id=..., unique_for=seconds)`` checked at the call.

A schedule with ``unique_for`` opens a window of that many seconds for its id when it stores a
message; any other schedule with ``unique_for`` of the id while the window is open is refused,
whatever became of the first message (waiting, running, acknowledged, cancelled or dead). The
window lives in the queue's ``unique`` zset (QueueKeys.unique), written by schedule_unique.lua
and send_once.lua in the same call that stores the message (docs/flow-control.md).
"""

from __future__ import annotations

import math
import numbers
from datetime import timedelta
from decimal import Decimal

from django_delayqueue.core.due_times import MAX_DUE_MS, round_up_ms
from django_delayqueue.core.due_times import _shown as _shown  # one way to show a bad value
from django_delayqueue.core.errors import PayloadError

UniqueFor = float | int | timedelta


def window_ms_of(unique_for: UniqueFor | None, message_id: str | None) -> int:
    """``unique_for`` in whole milliseconds (rounded up: a window is never shorter than asked),
    0 for None; PayloadError naming the problem for anything but a positive finite number of
    seconds (int, float, Decimal, Fraction; not a bool or a string) or timedelta, or for a
    window without an id."""
    if unique_for is None:
        return 0
    if isinstance(unique_for, timedelta):
        ms = (unique_for // timedelta(microseconds=1)) / 1000
    elif isinstance(unique_for, bool) or not isinstance(unique_for, (numbers.Real, Decimal)):
        raise PayloadError(
            "unique_for must be a number of seconds or a timedelta, not "
            f"{_shown(unique_for)} ({type(unique_for).__name__})"
        )
    else:
        try:
            seconds = float(unique_for)
        except (OverflowError, TypeError, ValueError):  # a huge int, Decimal("sNaN")
            seconds = math.nan
        ms = round(seconds * 1000, 6) if math.isfinite(seconds) else math.nan
    if not ms > 0:  # zero, negative, NaN, infinite
        raise PayloadError(
            f"unique_for must be more than 0 seconds and finite, not {_shown(unique_for)}"
        )
    if ms > MAX_DUE_MS:
        raise PayloadError(f"unique_for {_shown(unique_for)} is too long: windows end by year 9999")
    if message_id is None:
        raise PayloadError(
            "unique_for needs an id: the window belongs to an id (give id=, e.g. "
            "id=f'activation-{store.pk}')"
        )
    return round_up_ms(ms)
