"""``at=`` in any zone is stored as the UTC instant it names: fixed offsets, and Europe/Berlin on
both sides of its March and October daylight-saving transitions.

The expected due times are written as UTC wall clocks and converted with integer arithmetic
(``calendar.timegm``), not with ``datetime.timestamp()``, the code path under test. Each case
also checks the offset the zone gives, so a case cannot silently stop meaning what it says.
The dates are in 2031, so every message is pending with its due time as the zset score.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import redis

import django_delayqueue as dq
from django_delayqueue.core import Queue, QueueKeys

BERLIN = ZoneInfo("Europe/Berlin")
IST = timezone(timedelta(hours=5, minutes=30))
NEWFOUNDLAND = timezone(timedelta(hours=-3, minutes=-30))


def utc_ms(year: int, month: int, day: int, hour: int, minute: int, ms: int = 0) -> int:
    seconds = calendar.timegm((year, month, day, hour, minute, 0, 0, 0, 0))
    return seconds * 1000 + ms


# (name, aware datetime, the offset its zone gives it, the UTC instant in ms)
CASES = [
    (
        "berlin-last-ms-of-winter-time",  # 2031-03-30 02:00 CET jumps to 03:00 CEST
        datetime(2031, 3, 30, 1, 59, 59, 999_000, tzinfo=BERLIN),
        timedelta(hours=1),
        utc_ms(2031, 3, 30, 0, 59, 59_999),
    ),
    (
        "berlin-first-instant-of-summer-time",  # one millisecond later, an hour on the wall
        datetime(2031, 3, 30, 3, 0, tzinfo=BERLIN),
        timedelta(hours=2),
        utc_ms(2031, 3, 30, 1, 0),
    ),
    (
        "berlin-0230-first-time",  # 2031-10-26 03:00 CEST falls back to 02:00 CET
        datetime(2031, 10, 26, 2, 30, tzinfo=BERLIN, fold=0),
        timedelta(hours=2),
        utc_ms(2031, 10, 26, 0, 30),
    ),
    (
        "berlin-0230-second-time",  # the same wall clock an hour later
        datetime(2031, 10, 26, 2, 30, tzinfo=BERLIN, fold=1),
        timedelta(hours=1),
        utc_ms(2031, 10, 26, 1, 30),
    ),
    (
        "berlin-summer",
        datetime(2031, 7, 1, 12, 0, 0, 250_000, tzinfo=BERLIN),
        timedelta(hours=2),
        utc_ms(2031, 7, 1, 10, 0, 250),
    ),
    (
        "plus-0530",  # the previous day in UTC
        datetime(2031, 1, 1, 5, 0, tzinfo=IST),
        timedelta(hours=5, minutes=30),
        utc_ms(2030, 12, 31, 23, 30),
    ),
    (
        "minus-0330",  # the next day in UTC
        datetime(2031, 1, 1, 22, 0, tzinfo=NEWFOUNDLAND),
        -timedelta(hours=3, minutes=30),
        utc_ms(2031, 1, 2, 1, 30),
    ),
]
IDS = [case[0] for case in CASES]


@pytest.mark.parametrize(("name", "at", "offset", "expected"), CASES, ids=IDS)
def test_the_cases_mean_what_they_say(
    name: str, at: datetime, offset: timedelta, expected: int
) -> None:
    assert at.utcoffset() == offset
    assert at.astimezone(timezone.utc) == datetime.fromtimestamp(expected / 1000, timezone.utc)


def test_the_transitions_are_where_the_cases_say() -> None:
    last_winter, first_summer = CASES[0][3], CASES[1][3]
    assert first_summer - last_winter == 1  # an hour apart on the wall, 1 ms apart in UTC
    first, second = CASES[2][3], CASES[3][3]
    assert second - first == 3_600_000  # the same wall clock, an hour apart in UTC


def stored(q: Queue, message_id: str) -> tuple[int, int | None, int | None]:
    """The pending score in Redis, and the score and envelope due time that peek reports."""
    (peeked,) = [m for m in q.peek("pending", limit=100).messages if m.id == message_id]
    score = q.client.zscore(q.keys.pending, message_id)
    assert score is not None, f"{message_id} is not pending"
    return int(score), peeked.score_ms, peeked.due_ms


@pytest.mark.parametrize(("name", "at", "offset", "expected"), CASES, ids=IDS)
def test_queue_schedule_stores_the_utc_instant(
    make_queue: Callable[..., Queue], name: str, at: datetime, offset: timedelta, expected: int
) -> None:
    q = make_queue("orders")
    result = q.schedule({"case": name}, at=at, id=name)
    assert result.due_ms == expected
    assert stored(q, name) == (expected, expected, expected)


def test_schedule_many_stores_the_utc_instants(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("orders")
    bulk = q.schedule_many([{"payload": {}, "id": name, "at": at} for name, at, _, _ in CASES])
    assert bulk.scheduled == len(CASES)
    for name, _, _, expected in CASES:
        assert stored(q, name) == (expected, expected, expected)


@pytest.mark.parametrize(("name", "at", "offset", "expected"), CASES, ids=IDS)
def test_dq_schedule_stores_the_utc_instant(
    redis_client: redis.Redis, name: str, at: datetime, offset: timedelta, expected: int
) -> None:
    message_id = dq.schedule("order-close", {"case": name}, at=at, id=name, on_commit=False)
    assert message_id == name
    assert redis_client.zscore(QueueKeys("dq", "order-close").pending, name) == expected
    assert stored(dq.get_queue("order-close"), name) == (expected, expected, expected)


def test_one_instant_in_three_zones_is_one_due_time(redis_client: redis.Redis) -> None:
    """The same instant written in three zones gets the same due time each time."""
    instant = datetime(2031, 10, 26, 1, 30, tzinfo=timezone.utc)
    for at in (instant, instant.astimezone(BERLIN), instant.astimezone(IST)):
        dq.schedule("order-close", {}, at=at, id=f"{at.utcoffset()}", on_commit=False)
    scores = redis_client.zrange(QueueKeys("dq", "order-close").pending, 0, -1, withscores=True)
    assert [score for _, score in scores] == [utc_ms(2031, 10, 26, 1, 30)] * 3
    assert instant.astimezone(BERLIN).fold == 1  # the second 02:30 of that night
