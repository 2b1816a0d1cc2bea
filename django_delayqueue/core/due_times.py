"""Due times and retry delays as the scripts store them: whole epoch milliseconds, rounded up
(a handler never starts before the instant asked for), bounded to what a double holds exactly.
"""

from __future__ import annotations

import math
import numbers
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from django_delayqueue.core.errors import MAX_RETRY_DELAY_SECONDS, PayloadError

Delay = float | int | timedelta

# Every due time lies before 10000-01-01T00:00:00Z: as far as a datetime goes, and well inside
# the 2**53 ms a double (Lua's numbers, sorted-set scores) holds to the millisecond. A larger
# value (an inf that slipped through, 1e300 seconds) would be stored rounded, or not at all.
MAX_DUE_MS = 253_402_300_800_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def delay_ms_of(delay: Delay) -> float:
    """``delay`` in milliseconds, fraction kept; PayloadError unless a number (int, float,
    Decimal, Fraction, not a bool or a string) or a timedelta, finite, >= 0 and bounded.

    Rounded to the nanosecond: float noise (0.29 * 1000 is 290.00000000000006) must not add a
    whole millisecond when the due time is rounded up.
    """
    if isinstance(delay, timedelta):
        ms = (delay // timedelta(microseconds=1)) / 1000  # whole microseconds: exact
    else:
        # A number, not whatever float() takes: "5" or True is a caller's mistake (a form
        # field not converted, a flag passed in the wrong place), not five seconds or one.
        if isinstance(delay, bool) or not isinstance(delay, (numbers.Real, Decimal)):
            raise PayloadError(
                f"delay must be a number of seconds or a timedelta, not {_shown(delay)} "
                f"({type(delay).__name__})"
            )
        try:
            seconds = float(delay)
        except OverflowError:  # an int beyond a float: far past year 9999
            raise PayloadError(
                f"delay {_shown(delay)} is too long: due times end with year 9999"
            ) from None
        except (TypeError, ValueError):  # Decimal("sNaN")
            raise PayloadError(
                f"delay must be zero or more seconds and finite, not {_shown(delay)}"
            ) from None
        if not math.isfinite(seconds):
            raise PayloadError(
                f"delay must be zero or more seconds and finite, not {_shown(delay)}"
            )
        ms = round(seconds * 1000, 6)
    if ms < 0:
        raise PayloadError(f"delay must be zero or more seconds, not {_shown(delay)}")
    if ms > MAX_DUE_MS:
        raise PayloadError(f"delay {_shown(delay)} is too long: due times end with year 9999")
    return ms


def _shown(value: Any) -> str:
    """``value`` for an error message: its repr, shortened (a 10**5000 delay has no repr at
    all past Python's int-string limit, and would turn a PayloadError into a ValueError)."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the PayloadError either
        return f"an int of {value.bit_length()} bits" if isinstance(value, int) else "?"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def round_up_ms(ms: float) -> int:
    """``ms`` rounded up to a whole millisecond, float noise (below a nanosecond) ignored."""
    return math.ceil(round(ms, 6))


def at_ms(at: datetime | int | float) -> int:
    """``at`` in epoch milliseconds, rounded up (never before the instant asked for)."""
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise PayloadError(
                "at= needs a timezone-aware datetime (naive datetimes are ambiguous)"
            )
        # Whole microseconds, exactly: at.timestamp() * 1000 is a float, off by noise.
        micros = (at - _EPOCH) // timedelta(microseconds=1)
        due = -(-micros // 1000)
    elif isinstance(at, int) and not isinstance(at, bool):
        due = at  # epoch milliseconds
    elif isinstance(at, float):
        if not math.isfinite(at):
            raise PayloadError(f"at= must be finite epoch milliseconds, not {_shown(at)}")
        if abs(at) > MAX_DUE_MS:  # before rounding: ceil(1e300) is a 300-digit int
            raise PayloadError(f"at= {_shown(at)} is beyond year 9999 (epoch milliseconds)")
        due = round_up_ms(at)
    else:
        raise PayloadError(f"at= must be an aware datetime or epoch milliseconds, not {_shown(at)}")
    if abs(due) > MAX_DUE_MS:
        raise PayloadError(f"at= {_shown(at)} is beyond year 9999, where due times end")
    return due


def retry_ms(seconds: Any, backoff_max: float) -> int:
    """A retry delay as whole milliseconds that nack.lua can store, whatever reached here.

    Retry() checks its delay, but an outcome may come from elsewhere (a subclass, a custom
    consumer, a setting). A nack whose arguments Redis refuses is never recorded, and the
    consumer would try to record it forever: so a delay that is not a number, not finite or
    too long becomes ``backoff_max``, a negative one 0. One bad value costs one message's
    timing, never the consumer.
    """
    try:
        value = float(seconds)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if value < 0:
        return 0
    if not value <= MAX_RETRY_DELAY_SECONDS:  # nan, inf, 1e300
        cap = float(backoff_max)
        value = min(cap, MAX_RETRY_DELAY_SECONDS) if cap >= 0 else 0.0  # nan cap: at once
    return round_up_ms(value * 1000)
