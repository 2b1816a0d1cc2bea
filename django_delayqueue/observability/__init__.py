"""Observability without Django, kept here for the Django layer's existing callers: the modules
live in :mod:`django_delayqueue.core.observability` (the Django-free core schedules and
delivers messages and imports nothing above itself), and ``context``, ``tracing`` and
``log_fields`` here only re-export them. New code imports the core's modules.
"""
