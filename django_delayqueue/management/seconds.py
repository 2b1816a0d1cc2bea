"""Options of the management commands that are a number of seconds (``runqueue --grace``,
``queuestats --watch``): NaN and infinity refused by name, with what was given.

``float()`` reads "nan", "inf" and "-5" without complaint, and every comparison with NaN is
false: a ``--grace nan`` was silently 0, an ``inf`` a wait without end. Each option is checked
twice over: by argparse (the command line, and ``call_command`` with strings) and in
``handle()`` (``call_command(..., grace=-5)`` hands the value over as it is, unparsed).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError

from django_delayqueue.core.settings import nan_or_infinite


def seconds_problem(value: Any, *, zero: bool) -> str | None:
    """What keeps ``value`` from being a number of seconds (above 0, or 0 too with ``zero``),
    or None."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if number and not nan_or_infinite(value) and (value > 0 or (zero and value == 0)):
        return None
    return f"a finite number of seconds, {'0 or more' if zero else 'above 0'}, not {value!r}"


def seconds_type(*, zero: bool) -> Any:
    """An argparse ``type=`` for a number of seconds (see :func:`seconds_problem`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or seconds_problem(value, zero=zero):
            raise argparse.ArgumentTypeError(
                f"expected a finite number of seconds, {'0 or more' if zero else 'above 0'}, "
                f"not {text!r}"
            )
        return value

    return parse


def checked_seconds(option: str, value: Any, *, zero: bool) -> float:
    """``value`` of ``option`` as given to ``handle()``, or CommandError naming the problem."""
    problem = seconds_problem(value, zero=zero)
    if problem:
        raise CommandError(f"{option} must be {problem}")
    return float(value)
