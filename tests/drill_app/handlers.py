"""The receiver of queue "drill": records each delivery in the ledger, then does what the
payload asks (``{"do": "raise" | "exit" | "sleep:S" | "ok"}``; default ``$DRILL_MODE`` or "ok").

``do`` may also be a list, one action per attempt (the last one for every later attempt):
``{"do": ["sleep:600", "ok"]}`` blocks on the first delivery and succeeds on the next.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.dispatch import receiver
from ledger import EXIT, OK, RAISE, Ledger

from django_delayqueue.core import Message
from django_delayqueue.registry import topic

_ledger = Ledger(os.environ["DRILL_LEDGER"])


@receiver(topic("drill"))
def on_drill(sender: str, message: Message, **kwargs: Any) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    action = payload.get("do") or os.environ.get("DRILL_MODE", "ok")
    if isinstance(action, list):
        action = action[min(message.attempt, len(action)) - 1]
    kind = {"raise": RAISE, "exit": EXIT}.get(action, OK)
    _ledger.record(message.id, message.due_ms, message.attempt, kind)
    if action == "raise":
        raise RuntimeError(f"drill: failing attempt {message.attempt}")
    if action == "exit":
        os._exit(3)
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
