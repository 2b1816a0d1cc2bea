"""django_delayqueue.core.recurring.keeper: a ScheduleKeeper driven round by round, without a
consumer (keeper_rounds), on a real Redis."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from core_consumer_support import T0, keeper_rounds

from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper


def test_a_schedule_that_cannot_be_computed_is_logged_once_not_every_second(
    make_queue: Any, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue("reports")
    broken = Recurrence("broken", "reports", every=60)
    object.__setattr__(broken, "every", 4e11)  # past validation: its tick ids are no dates
    keeper = ScheduleKeeper()
    keeper.set_definitions([broken, Recurrence("fine", "reports", every=60)], [q])
    with caplog.at_level(logging.DEBUG, "django_delayqueue.core.recurring.keeper"):
        for second in range(5):  # past FAILED_PAUSE_MS each time: tried again
            keeper_rounds(keeper, [q], redis_client, T0 + second * 1000)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "schedule broken" in errors[0]
    assert redis_client.hexists(q.keys.recurrence_states, "fine")  # the others go on
    assert not redis_client.hexists(q.keys.recurrence_states, "broken")
