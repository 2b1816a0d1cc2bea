"""Re-exports :mod:`django_delayqueue.core.observability.log_fields`, where the structured fields
of every log line about one message (``dq_message_id``, ``dq_queue``, ``dq_attempt``) now live
(the Django-free core logs with them, and imports nothing above itself).

Kept for the Django layer's existing callers; new code imports the core's module.
"""

from django_delayqueue.core.observability.log_fields import (
    ATTEMPT,
    MESSAGE_ID,
    QUEUE,
    id_fields,
    message_fields,
)

__all__ = ["ATTEMPT", "MESSAGE_ID", "QUEUE", "id_fields", "message_fields"]
