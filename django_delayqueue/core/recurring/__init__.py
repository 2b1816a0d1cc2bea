"""Recurring schedules (cron and intervals) kept by the consumers themselves."""

from django_delayqueue.core.recurring.keeper import ScheduleKeeper
from django_delayqueue.core.recurring.recurrence import Recurrence, parse_tick_id, tick_id

__all__ = ["Recurrence", "ScheduleKeeper", "parse_tick_id", "tick_id"]
