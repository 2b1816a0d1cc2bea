"""The shop's tasks, for Django's Tasks framework (settings.TASKS: django-delayqueue's backend).

from demo_project.shop.tasks import send_receipt
send_receipt.using(run_after=timedelta(minutes=5)).enqueue(order.pk)
"""

from __future__ import annotations

try:  # Django 6.0+
    from django.tasks import task
except ImportError:  # Django 4.2-5.2: the backport (pip install django-tasks)
    from django_tasks import task

from .models import Order
from .sms import send_sms


@task(queue_name="shop-tasks")
def send_receipt(order_id: int) -> str:
    """Text the buyer a receipt for a paid order; returns what was sent (the task's result)."""
    order = Order.objects.get(pk=order_id)
    text = f"Thank you! Order #{order.pk} is paid."
    send_sms("+10000000000", text, kind="receipt", store_id=None)
    return text
