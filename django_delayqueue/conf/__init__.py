"""Settings plumbing of the Django layer, one module a concern:

- ``settings``: the ``DELAYQUEUE`` dict read lazily over defaults, per-queue file settings;
- ``connection``: the one Redis client and clock the settings describe;
- ``overrides``: queue settings staff changed in the admin, published to Redis;
- ``sync``: the ``QueueConfig`` rows kept in step with the settings file (needs the models);
- ``queues``: the one place that builds a ``Queue`` for Django;
- ``caches``: one ``setting_changed`` receiver resetting all of the above.
"""

from django_delayqueue.conf import caches as _caches  # noqa: F401  (connects the receiver)
