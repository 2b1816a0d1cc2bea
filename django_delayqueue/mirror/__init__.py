"""What staff may edit, kept in step from the settings file to every process::

    settings file ──sync──► rows staff edit (admin) ──publish on commit──► Redis ──► every process

One mechanism (``pipeline.Mirror``) for each kind of editable values (``kinds``):

- the queue settings of :data:`~.queue_overrides.MIRRORED_FIELDS` (``QueueConfig`` rows, one
  ``config`` hash per queue in Redis: ``queue_overrides``);
- the recurring schedules (``RecurringSchedule`` rows, published as one set: ``recurrences``).

A worker follows what is published with ``following`` (its queues' settings read back at each
refresh, put back in Redis when Redis lost them).

``queue_overrides`` and ``recurrences`` import no model: ``conf.queues`` reads a queue's
effective settings from the first, before the apps are ready. Only ``pipeline`` and ``kinds``
touch the rows (``following`` through ``kinds``).
"""
