"""Helpers for testing your own handlers against a real Redis, the way ``runqueue`` runs them.

    from django_delayqueue.testing import deliver_due, deliver_now

    def test_unpaid_order_is_closed(order):
        dq.schedule("order-close", {"order_id": order.pk}, delay=1800, id=f"order-{order.pk}",
                    on_commit=False)
        deliver_now("order-close", f"order-{order.pk}")   # no need to wait 30 minutes
        order.refresh_from_db()
        assert order.status == "closed"

Both run the real consumer in this process (``runqueue --burst``): handlers, retries and dead
letters behave as in production. For a Redis of the tests' own, see ``django_delayqueue.embedded``.
"""

from __future__ import annotations

from django.core.management import call_command

from django_delayqueue.conf.queues import get_queue


def deliver_due(*queues: str) -> None:
    """Deliver every message of ``queues`` (default: all configured) that is due now."""
    call_command("runqueue", "--burst", *queues, verbosity=0)


def deliver_now(queue: str, *ids: str) -> int:
    """Make the waiting messages ``ids`` of ``queue`` due now and deliver them (and whatever
    else is due on that queue). Returns how many of ``ids`` were made due."""
    moved = get_queue(queue).run_now(*ids)
    deliver_due(queue)
    return moved
