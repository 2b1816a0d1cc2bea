"""Recurring schedules, the Django side: declared in ``DELAYQUEUE["SCHEDULES"]`` or in the
admin, published to Redis, kept firing by every ``runqueue`` (see ``core.recurring``)."""
