"""One ``django.dispatch.Signal`` per queue: the handlers of a queue are its receivers."""

from __future__ import annotations

import threading

from django.dispatch import Signal

from .core.keys import validate_name

_signals: dict[str, Signal] = {}
_lock = threading.Lock()


def topic(name: str) -> Signal:
    """The signal of queue ``name`` (created on first use, then always the same object).

    Receivers are called as ``receiver(sender=<queue name>, message=<Message>)``.
    """
    signal = _signals.get(name)
    if signal is None:
        validate_name(name, "queue name")
        with _lock:
            signal = _signals.setdefault(name, Signal())
    return signal


def topics() -> dict[str, Signal]:
    """Every signal created so far, by queue name (for the checks)."""
    with _lock:
        return dict(_signals)
