"""Settings plumbing of the Django layer, one module a concern:

- ``settings``: the ``DELAYQUEUE`` dict read lazily over defaults, per-queue file settings;
- ``connection``: the one Redis client and clock the settings describe;
- ``queues``: the one place that builds a ``Queue`` for Django, with the effective settings
  (the file's, and what staff changed in the admin: see ``django_delayqueue.mirror``);
- ``task_backends``, ``task_registry``: the queues a TASKS backend of this app takes;
- ``caches``: one ``setting_changed`` receiver resetting all of the above.
"""

from django_delayqueue.conf import caches as _caches  # noqa: F401  (connects the receiver)
