"""Re-exports :mod:`django_delayqueue.core.observability.tracing`, where the producer and delivery
spans now live (the Django-free core starts them, and imports nothing above itself).

Kept for the Django layer's existing callers (``api``, ``worker``, ``tasks.backend``,
``checks``); new code imports the core's module. Nothing is defined here: the tracer found, the
parent mode and the logged-once flag are the core module's globals, so a test that turns
tracing on patches that module (``_tracer``), not this one.
"""

from django_delayqueue.core.observability.tracing import (
    NO_SPAN,
    PARENT_MODES,
    SYSTEM,
    Delivery,
    Outcome,
    delivery_ended,
    delivery_started,
    outcome_name,
    producing,
    record_failure,
    reset,
    scheduled,
    set_parent_mode,
    tracer,
)

__all__ = [
    "NO_SPAN",
    "PARENT_MODES",
    "SYSTEM",
    "Delivery",
    "Outcome",
    "delivery_ended",
    "delivery_started",
    "outcome_name",
    "producing",
    "record_failure",
    "reset",
    "scheduled",
    "set_parent_mode",
    "tracer",
]
