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
    except TypeError as e:  # recorded as a TypeError (see _cause), in json's own words
        in_words = _in_json_words(value, e)
        raise PayloadError(f"return value is not JSON-serialisable: {in_words}") from in_words


def _in_json_words(value: Any, error: TypeError) -> TypeError:
    """The framework's TypeError for a value that is not JSON ("Unsupported type: ..."), said
    as Python's json says it ("Object of type function is not JSON serializable"): the words
    users and django-tasks-db's suite search a result's traceback for. The framework's error
    is its cause, so the traceback has both."""
    try:
        json.dumps(value)
        said = ""
    except Exception as json_error:  # TypeError, or what json refuses otherwise
        said = str(json_error)
    if "is not JSON serializable" not in said:  # e.g. "keys must be str, int, ..."
        said = f"{error}: the return value is not JSON serializable"
    in_words = TypeError(said)
    in_words.__cause__ = error
    return in_words


def _cause(error: Exception) -> BaseException:
    """What a task's result records for ``error``: json's own TypeError or ValueError when
    that is what PayloadError wraps (as Django's backends record a value that is not JSON)."""
    cause = error.__cause__
    if isinstance(error, PayloadError) and isinstance(cause, (TypeError, ValueError)):
        return cause
    return error
