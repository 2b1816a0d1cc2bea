"""The demo shop's data: orders that close when left unpaid, stores that get an activation SMS."""

from django.db import models
from django.utils import timezone


class Order(models.Model):
    class Status(models.TextChoices):
        OPEN = "open", "Open"
        PAID = "paid", "Paid"
        CLOSED = "closed", "Closed"

    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    # A default rather than auto_now_add, so tests and bulk loads can set it.
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.status})"


class Store(models.Model):
    name = models.CharField(max_length=100)
    phone = models.CharField(max_length=32)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return self.name


class Product(models.Model):
    store = models.ForeignKey(Store, on_delete=models.CASCADE, related_name="products")
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class SentSms(models.Model):
    """What the default SMS backend "sent" (see sms.py)."""

    phone = models.CharField(max_length=32)
    text = models.TextField()
    kind = models.CharField(max_length=32, blank=True)
    store = models.ForeignKey(
        Store, null=True, blank=True, on_delete=models.SET_NULL, related_name="sms"
    )
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent_at", "-id"]
        verbose_name = "sent SMS"
        verbose_name_plural = "sent SMS"

    def __str__(self) -> str:
        return f"SMS to {self.phone}"
