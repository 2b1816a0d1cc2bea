"""The receiver of the atomic drill queues (``$DRILL_ATOMIC``, a JSON list of queue names that
drill_settings.py makes atomic): writes one :class:`~drill_app.models.Effect` row per run, in
the delivery's transaction, then does what the payload asks for this attempt (``{"do":
[ACTION, ...]}``, the last one for every later attempt; default "ok"):

- ``ok``: return (the transaction commits, the message is acknowledged);
- ``raise``: RuntimeError (rolled back, retried);
- ``commit-then-block``: return, and once the transaction has committed (an ``on_commit``
  callback, which runs before the consumer acknowledges) write ``committed <id> <pid>`` to
  ``$DRILL_MARKS`` and block: the window a ``kill -9`` lands in;
- ``next:QUEUE``: also schedule a follow-up ``next-<id>`` on QUEUE (through the outbox, in the
  same transaction).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from django.db import transaction

import django_delayqueue as dq
from django_delayqueue.api import topic
from django_delayqueue.core import Message

from .models import Effect

QUEUES = tuple(json.loads(os.environ.get("DRILL_ATOMIC", "[]")))
_never = threading.Event()


def on_atomic(sender: str, message: Message, **kwargs: Any) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    actions = payload.get("do") or ["ok"]
    action = actions[min(message.attempt, len(actions)) - 1]
    Effect.objects.create(
        queue=message.queue,
        message_id=message.id,
        scheduled_ms=message.scheduled_ms,
        attempt=message.attempt,
    )
    follow = payload.get("next")
    if follow:
        dq.schedule(follow, {"after": message.id}, id=f"next-{message.id}", delay=3600)
    if action == "raise":
        raise RuntimeError(f"drill: failing attempt {message.attempt}")
    if action == "commit-then-block":
        transaction.on_commit(lambda: _block_after_commit(message))


def _block_after_commit(message: Message) -> None:
    with open(os.environ["DRILL_MARKS"], "a") as marks:
        marks.write(f"committed {message.id} {os.getpid()}\n")
    while not _never.wait(1):  # until the drill kills this process
        pass


for _name in QUEUES:
    topic(_name).connect(on_atomic, weak=False)
