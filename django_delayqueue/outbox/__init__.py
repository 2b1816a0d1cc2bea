"""The transactional outbox: a message scheduled inside a transaction is never lost.

``dq.schedule`` (and a Tasks-backend enqueue) inside ``transaction.atomic`` writes an
:class:`~django_delayqueue.models.OutboxMessage` row in the same transaction and sends the
message right after the commit, deleting the row (``committing``). If Redis could not take it
then, the row stays, and the relay every ``runqueue`` runs (``relay``) sends it when Redis is
back, with its original due time. Each row is sent under its own token (``Queue.send_once``),
so a row sent twice is stored once. ``backlog`` tells how many rows wait, and for how long.
"""
