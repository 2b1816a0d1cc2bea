"""What the demo's recurring sales report writes: one row per tick of its schedule."""

from django.db import models
from django.utils import timezone


class SalesReport(models.Model):
    # The tick's message id ("sales-report@2026-01-01T10:00:00Z"): a tick delivered twice (at
    # least once delivery) writes one row.
    tick = models.CharField(max_length=100, unique=True)
    due_at = models.DateTimeField()
    written_at = models.DateTimeField(default=timezone.now)
    orders_open = models.PositiveIntegerField(default=0)
    orders_paid = models.PositiveIntegerField(default=0)
    orders_closed = models.PositiveIntegerField(default=0)
    sms_sent = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-due_at"]

    def __str__(self) -> str:
        return (
            f"{self.due_at:%H:%M:%S}: {self.orders_paid} paid, {self.orders_closed} closed, "
            f"{self.orders_open} open, {self.sms_sent} SMS"
        )
