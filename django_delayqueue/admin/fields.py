"""Form fields of the admin's settings rows (queue settings, recurring schedules)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from django_delayqueue.core.settings import nan_or_infinite


class SecondsField(forms.FloatField):
    """A number of seconds: NaN and infinity refused by name.

    Django's FloatField refuses them with its "Enter a number." (true of "abc", not of "nan",
    which Python reads as a float): staff who typed "inf" for "no limit" are told what to do.
    """

    def validate(self, value: Any) -> None:
        if nan_or_infinite(value):
            raise ValidationError(
                "Enter a finite number of seconds, not %(value)s (leave it empty for no limit "
                "where the field allows it).",
                code="not_finite",
                params={"value": value},
            )
        super().validate(value)
