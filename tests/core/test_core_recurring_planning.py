"""Which ticks a schedule gets: cron in a time zone across DST, intervals, catch-up policies,
edits and deletions (pure functions: any clock, no Redis)."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.recurring import Recurrence, parse_tick_id, tick_id
from django_delayqueue.core.recurring.planning import RecurrenceState, plan_ticks, signature_of

BERLIN = ZoneInfo("Europe/Berlin")


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: Any = BERLIN) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=tz).timestamp() * 1000)


def berlin(instant_ms: int) -> str:
    return datetime.fromtimestamp(instant_ms / 1000, BERLIN).isoformat()


def walk(r: Recurrence, start_ms: int, count: int) -> list[str]:
    out, at = [], start_ms
    for _ in range(count):
        at = r.next_after(at)
        out.append(berlin(at))
    return out


def test_a_daily_cron_in_berlin_fires_once_across_spring_forward_and_fall_back() -> None:
    nightly = Recurrence("nightly", "reports", cron="30 2 * * *", timezone="Europe/Berlin")
    # 2026-03-29: 02:00 becomes 03:00, so 02:30 does not exist: it fires once, at 03:00.
    assert walk(nightly, ms(2026, 3, 28, 12), 3) == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    # 2026-10-25: 03:00 becomes 02:00 again, so 02:30 happens twice: it fires once.
    assert walk(nightly, ms(2026, 10, 24, 12), 2) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_an_hourly_cron_follows_the_clock_through_both_changes() -> None:
    hourly = Recurrence("hourly", "reports", cron="0 * * * *", timezone="Europe/Berlin")
    spring = walk(hourly, ms(2026, 3, 29, 0, 30), 3)
    assert spring == [
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:00 never happened: an hour later by the clock
        "2026-03-29T04:00:00+02:00",
    ]
    fall = walk(hourly, ms(2026, 10, 25, 0, 30), 4)
    assert fall == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the repeated hour is a real hour later: it runs
        "2026-10-25T03:00:00+01:00",
    ]
    # Every tick is a distinct instant an hour apart: none doubled, none skipped.
    instants = [datetime.fromisoformat(t).timestamp() for t in fall]
    assert [b - a for a, b in itertools.pairwise(instants)] == [3600.0] * 3


def test_every_ticks_on_whole_multiples_since_the_epoch() -> None:
    r = Recurrence("five", "payments", every=300)
    assert r.next_after(1_700_000_000_000) == 1_700_000_100_000
    assert r.next_after(1_700_000_100_000) == 1_700_000_400_000  # strictly after
    assert r.instants(1_700_000_100_000, 1_700_001_000_000, 2) == [
        1_700_000_700_000,
        1_700_001_000_000,
    ]


def test_tick_ids_name_the_schedule_and_the_instant() -> None:
    at = ms(2026, 11, 25, 3)
    assert tick_id("nightly-report", at) == "nightly-report@2026-11-25T02:00:00Z"
    assert parse_tick_id(tick_id("nightly-report", at)) == ("nightly-report", at)
    assert parse_tick_id(tick_id("x", at + 250)) == ("x", at + 250)
    assert parse_tick_id("an ordinary id") is None
    assert parse_tick_id("a@b") is None
    # Only the exact form: sharded queues route such ids by the name before the "@".
    for other in ("invoice@20240501Z", "x@2024-W18Z", "a@2024-05-01Z", "a b@2024-05-01T10:00:00Z"):
        assert parse_tick_id(other) is None


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "q"}, "exactly one of 'cron' and 'every'"),
        ({"queue": "q", "cron": "0 3 * *", "every": 5}, "exactly one"),
        ({"queue": "q", "cron": "61 * * * *"}, "bad cron expression"),
        ({"queue": "q", "every": 0.5}, "at least 1"),
        ({"queue": "q", "every": 4e11}, "at most 315360000 (ten years)"),
        ({"queue": "q", "every": 10**400}, "at most 315360000"),  # no float holds it
        ({"queue": "q", "every": float("inf")}, "at most 315360000"),
        ({"queue": "q", "every": float("nan")}, "'every' must be a number of seconds"),
        ({"queue": "q", "cron": "*/5 * * * * *"}, "five fields (minute hour day-of-month"),
        ({"queue": "q", "cron": "0 3 * * * 2026"}, "five fields"),
        # The 1st of a month that is its fifth Monday: valid fields that never fire.
        ({"queue": "q", "cron": "0 0 */40 * MON#5"}, "never fires"),
        ({"queue": "q", "every": 60, "catch_up_limit": 10**6}, "between 1 and 10000"),
        ({"queue": "q", "every": 60, "timezone": "Mars/Olympus"}, "unknown timezone"),
        # Before: ZoneInfo raised OSError (a file name too long) out of every reader.
        ({"queue": "q", "every": 60, "timezone": "a" * 300}, "unknown timezone"),
        ({"queue": "q", "every": 60, "catch_up": "some"}, "'catch_up' must be one of"),
        ({"queue": "q", "every": 60, "payload": {1, 2}}, "must be JSON"),
        # Before: accepted, then every tick failed to encode (surrogate) or, in a consumer with
        # a deeper stack, to decode; 5000 levels raised RecursionError out of the check.
        ({"queue": "q", "every": 60, "payload": "\udcff"}, "'payload' holds a lone surrogate"),
        ({"queue": "q", "every": 60, "payload": nested(201)}, "'payload' nests arrays and"),
        ({"queue": "q", "every": 60, "payload": nested(5_000)}, "more than 200 levels deep"),
        ({"queue": "q", "every": 60, "task": "a.b", "args": [nested(199)]}, "'args'/'kwargs' nes"),
        ({"queue": "q", "every": 60, "task": "a.b", "kwargs": {"k": "\ud800"}}, "surrogate"),
        ({"queue": "q", "every": 60, "when": "daily"}, "unknown option(s) when"),
        ({"every": 60}, "'queue'"),
    ],
)
def test_bad_definitions_are_refused_with_the_problem_named(options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match="schedule 'nightly'") as e:
        Recurrence.from_mapping("nightly", options)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("night ly", "may not contain '@', spaces or control"),
        ("night\nly", "may not contain '@', spaces or control"),
        ("night@ly", "may not contain '@'"),
        # Before: accepted by the check, then every runqueue failed to route its ticks.
        ("night\udcffly", "lone surrogate"),
    ],
)
def test_bad_names_are_refused(name: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        Recurrence.from_mapping(name, {"queue": "q", "every": 60})
    assert message in str(e.value)


# --- plans ----------------------------------------------------------------------------------------

MINUTE = 60_000
T = 1_700_000_040_000  # a whole minute


def state(cursor: int, r: Recurrence, version: int = 0) -> str:
    return RecurrenceState(cursor, signature_of(r), version).encode()


def test_a_new_schedule_starts_with_its_next_tick() -> None:
    r = Recurrence("digest", "q", every=60)
    plan = plan_ticks(r, None, T + 5)
    assert plan is not None and plan.instants == (T + MINUTE,) and not plan.withdraw
    assert plan.expected == "" and plan.new_state == state(T + MINUTE, r)


def test_nothing_to_do_while_the_latest_tick_waits() -> None:
    r = Recurrence("digest", "q", every=60)
    assert plan_ticks(r, state(T + MINUTE, r), T + 5) is None


def test_the_next_tick_follows_once_the_latest_is_due() -> None:
    r = Recurrence("digest", "q", every=60)
    plan = plan_ticks(r, state(T, r), T + 3)
    assert plan is not None and plan.instants == (T + MINUTE,) and plan.missed == 0


@pytest.mark.parametrize(
    ("policy", "created", "dropped", "missed"),
    [("latest", [9], [1], 8), ("all", [2, 3, 4, 5, 6, 7, 8, 9], [], 0), ("none", [], [1], 9)],
)
def test_catch_up_after_an_outage(
    policy: str, created: list[int], dropped: list[int], missed: int
) -> None:
    r = Recurrence("digest", "q", every=60, catch_up=policy)  # type: ignore[arg-type]
    # Tick 1 was the latest created, waiting when every consumer went down; the outage ends
    # 9.5 minutes later: ticks 1..9 were missed (1 was made, the others never were).
    plan = plan_ticks(r, state(T + MINUTE, r), T + 9 * MINUTE + 30_000)
    assert plan is not None
    assert plan.instants == (*(T + n * MINUTE for n in created), T + 10 * MINUTE)
    assert plan.drop == tuple(T + n * MINUTE for n in dropped)
    assert (plan.missed, plan.missed_exact) == (missed, True)


def test_the_waiting_tick_only_just_due_is_not_missed() -> None:
    r = Recurrence("digest", "q", every=60, catch_up="none")
    plan = plan_ticks(r, state(T, r), T + 1500)  # the round came 1.5 s after the tick
    assert plan is not None and plan.drop == () and plan.instants == (T + MINUTE,)


def test_a_long_outage_counts_every_skipped_tick() -> None:
    r = Recurrence("beat", "q", every=1, catch_up="latest", catch_up_limit=3)
    plan = plan_ticks(r, state(T, r), T + 1_000_000)
    assert plan is not None and plan.missed == 998 and plan.missed_exact
    nightly = Recurrence("n", "q", cron="* * * * *", catch_up="none", catch_up_limit=3)
    plan = plan_ticks(nightly, state(T, nightly), T + 1000 * MINUTE)
    assert plan is not None and plan.missed >= 3 and not plan.missed_exact


def test_catch_up_all_is_bounded_to_the_latest_ticks() -> None:
    r = Recurrence("digest", "q", every=60, catch_up="all", catch_up_limit=3)
    plan = plan_ticks(r, state(T, r), T + 100 * MINUTE + 1)
    assert plan is not None
    # 98 and 99 missed, 100 only just late (within the grace), 101 the next.
    assert plan.instants == tuple(T + n * MINUTE for n in (97, 98, 99, 100, 101))
    assert plan.drop == (T,) and plan.missed == 97  # ticks 0..96 skipped, and said so


def test_a_tick_only_just_late_is_never_counted_missed() -> None:
    r = Recurrence("beat", "q", every=1, catch_up="none")
    plan = plan_ticks(r, state(T, r), T + 1000 + 400)  # the round came 0.4 s late
    assert plan is not None and plan.instants == (T + 1000, T + 2000)


def test_an_edit_withdraws_the_waiting_tick_and_starts_from_now() -> None:
    old = Recurrence("digest", "q", every=3600)
    new = Recurrence("digest", "q", cron="*/5 * * * *")
    plan = plan_ticks(new, state(T + 3_600_000, old), T)
    assert plan is not None and plan.withdraw and plan.instants == (new.next_after(T),)


def test_a_paused_schedule_withdraws_its_tick_and_resumes_from_now() -> None:
    r = Recurrence("digest", "q", every=60)
    paused = Recurrence("digest", "q", every=60, paused=True)
    plan = plan_ticks(paused, state(T + MINUTE, r), T)
    assert plan is not None and plan.withdraw and plan.instants == ()
    assert plan_ticks(paused, plan.new_state, T + 50 * MINUTE) is None  # nothing while paused
    resumed = plan_ticks(r, plan.new_state, T + 50 * MINUTE + 1)
    assert resumed is not None and resumed.instants == (T + 51 * MINUTE,)  # no catch-up


def test_a_deleted_schedule_goes_and_a_newer_state_is_left_alone() -> None:
    r = Recurrence("digest", "q", every=60)
    plan = plan_ticks(None, state(T, r), T, version=3)
    assert plan is not None and plan.withdraw and plan.forget and plan.instants == ()
    assert plan.new_state == "0 deleted 3"  # a tombstone: see the next test
    assert plan_ticks(None, plan.new_state, T, version=3) is None  # deleted once
    assert plan_ticks(None, None, T) is None
    # Written under definitions version 5: a consumer still on version 4 does nothing.
    assert plan_ticks(None, state(T, r, version=5), T, version=4) is None
    assert plan_ticks(Recurrence("digest", "q", every=7), state(T, r, 5), T, version=4) is None


def test_a_consumer_a_refresh_behind_cannot_bring_a_deleted_schedule_back() -> None:
    r = Recurrence("digest", "q", every=60)
    tombstone = plan_ticks(None, state(T, r, version=3), T, version=4)
    assert tombstone is not None
    assert plan_ticks(r, tombstone.new_state, T + 1, version=3) is None  # still has it: waits
    again = plan_ticks(r, tombstone.new_state, T + 1, version=5)  # added back later: starts
    assert again is not None and again.instants == (T + MINUTE,)


def test_catch_up_options_do_not_count_as_an_edit() -> None:
    a = Recurrence("digest", "q", every=60)
    b = Recurrence("digest", "q", every=60, catch_up="all", catch_up_limit=5)
    assert signature_of(a) == signature_of(b)
    assert signature_of(a) != signature_of(Recurrence("digest", "q", every=60, payload=1))


def test_a_cron_catch_up_walks_in_the_schedule_s_zone() -> None:
    nightly = Recurrence("nightly", "q", cron="0 3 * * *", timezone="Europe/Berlin", catch_up="all")
    last = ms(2026, 3, 27, 3)
    plan = plan_ticks(nightly, state(last, nightly), ms(2026, 3, 31, 12))
    assert plan is not None
    assert [berlin(t) for t in plan.instants] == [
        "2026-03-28T03:00:00+01:00",
        "2026-03-29T03:00:00+02:00",  # the DST day: 03:00 exists, once
        "2026-03-30T03:00:00+02:00",
        "2026-03-31T03:00:00+02:00",
        "2026-04-01T03:00:00+02:00",
    ]


def test_the_longest_interval_ticks_and_names_its_ticks() -> None:
    # Bounded so that every instant the code computes is a date (tick ids, the admin) and a
    # whole number Lua prints without an exponent (below 1e14 ms, the year 5138).
    r = Recurrence("decade", "q", every=315_360_000)
    at = r.next_after(T)
    assert T < at <= T + 315_360_000_000 and parse_tick_id(r.tick_id(at)) == ("decade", at)
    assert r.instants(0, T, 3)[-1] <= T < at


def test_utc_is_the_default_zone() -> None:
    r = Recurrence("u", "q", cron="0 0 * * *")
    start = int(datetime(2026, 6, 1, 12, tzinfo=timezone.utc).timestamp() * 1000)
    assert r.next_after(start) == int(datetime(2026, 6, 2, tzinfo=timezone.utc).timestamp() * 1000)


def test_a_tombstone_is_forgotten_once_every_consumer_has_seen_it() -> None:
    from django_delayqueue.core.recurring.planning import forget_tombstone

    r = Recurrence("digest", "q", every=60)
    deleted = plan_ticks(None, state(T, r, version=5), T, version=T)
    assert deleted is not None
    assert forget_tombstone(deleted.new_state, T) is None  # too recent
    forgotten = forget_tombstone(deleted.new_state, T + 1)
    assert forgotten is not None and forgotten.new_state == "" and forgotten.instants == ()
    assert forget_tombstone(state(T, r, version=5), T + 1) is None  # not a tombstone


def test_a_consumer_running_all_along_counts_no_tick_missed() -> None:
    r = Recurrence("beat", "q", every=1, catch_up="none")
    # Its round came 5 s late, but it has kept the schedules since T - 60 s without a break.
    plan = plan_ticks(r, state(T, r), T + 5000, running_since_ms=T - 60_000)
    assert plan is not None and plan.drop == () and plan.missed == 0
    assert plan.instants == tuple(T + n * 1000 for n in range(1, 7))
