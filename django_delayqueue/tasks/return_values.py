"""A task's return value as its result keeps it, and the error recorded when it cannot be kept
(the runner's, django_delayqueue.tasks.runner)."""

from __future__ import annotations

import json
from typing import Any

from django_delayqueue.core.envelope import encode_json
from django_delayqueue.core.errors import PayloadError
from django_delayqueue.tasks import framework


def _stored(value: Any) -> tuple[str, Any]:
    """The JSON text a return value is stored as, and the value a reader gets back from it."""
    kind = type(value)
    # The common returns, whose JSON and whose value read back are known without the round
    # trip through the framework's normalisation, the encoder and the decoder.
    if value is None:
        return "null", None
    if kind is bool:
        return ("true" if value else "false"), value
    if kind is int and -_SMALL_INT < value < _SMALL_INT:  # far from int-string limits
        return str(value), value
    # Escaped to ASCII, as before: a lone surrogate (a file name) is kept, not refused.
    returned = encode_json(_normalized(value), "return value", ascii_only=True)
    return returned, json.loads(returned)  # what a reader gets: lists, not tuples


_SMALL_INT = 10**18


def _normalized(value: Any) -> Any:
    """The return value as the framework's own backends keep it (Django 6: a tuple is a list,
    bytes are text, anything else that is not JSON a TypeError "Unsupported type: ...")."""
    normalize = framework.normalize_json
    if normalize is None:
        return value
    try:
        return normalize(value)
    except RecursionError:  # nested far too deep: the PayloadError that says how deep
        encode_json(value, "return value")
        raise
    except TypeError as e:  # recorded as the TypeError it is (see _cause)
        raise PayloadError(f"return value is not JSON-serialisable: {e}") from e


def _cause(error: Exception) -> BaseException:
    """What a task's result records for ``error``: json's own TypeError or ValueError when
    that is what PayloadError wraps (as Django's backends record a value that is not JSON)."""
    cause = error.__cause__
    if isinstance(error, PayloadError) and isinstance(cause, (TypeError, ValueError)):
        return cause
    return error
