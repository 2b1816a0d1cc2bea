"""The Django admin of the queues: the ModelAdmins (``registration``), the queue pages and their
actions (``views``), all reached from the "Delay queues" section of the admin index."""

from django_delayqueue.admin import recurrences, registration  # noqa: F401  (registers the ModelAdmins)
