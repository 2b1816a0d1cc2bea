"""The drill's database effects: what an atomic queue's handler writes (drill_app/atomic.py).

No unique constraint on purpose: a handler run twice for one message leaves two rows, which
is what the drills count."""

from __future__ import annotations

from django.db import models


class Effect(models.Model):
    queue = models.CharField(max_length=100)
    message_id = models.CharField(max_length=200)
    scheduled_ms = models.BigIntegerField()
    attempt = models.IntegerField()
