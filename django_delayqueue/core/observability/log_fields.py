"""The structured fields of every log line about one message, given as ``extra=``.

``dq_message_id``, ``dq_queue`` (the queue the line names: a shard's own name, such as
``order-close#3``, on a sharded queue) and ``dq_attempt`` (the delivery attempt, from 1; 0 on
the producer's side, before any delivery). A JSON log formatter writes a record's attributes,
so a log search for ``dq_message_id`` finds every line of one message, from the view that
scheduled it to its last delivery (docs/observability.md, "Logs").
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.envelope import Message

MESSAGE_ID = "dq_message_id"
QUEUE = "dq_queue"
ATTEMPT = "dq_attempt"


def message_fields(message: Message, queue: str | None = None) -> dict[str, Any]:
    """The fields of a line about one delivery of ``message``; ``queue``: the shard's name
    where ``message`` is the copy handlers see, named by its logical queue (worker.py), so
    that every line of one delivery names the shard, as the consumer's own lines do."""
    return {
        MESSAGE_ID: message.id,
        QUEUE: message.queue if queue is None else queue,
        ATTEMPT: message.attempt,
    }


def id_fields(queue: str, message_id: str, attempt: int = 0) -> dict[str, Any]:
    """The fields of a line about message ``message_id`` of ``queue`` (``attempt`` 0: not
    delivered yet, as on the producer's side)."""
    return {MESSAGE_ID: message_id, QUEUE: queue, ATTEMPT: attempt}
