"""supervisor/backoff.py: a child that keeps dying soon after its start is replaced later and
later; one that lived long resets the count."""

from __future__ import annotations

from django_delayqueue.supervisor.backoff import RestartBackoff


def test_one_quick_death_is_replaced_at_once_then_the_delay_doubles_up_to_a_bound() -> None:
    b = RestartBackoff(quick_seconds=10, first_seconds=0.5, most_seconds=4)
    assert [b.died(1) for _ in range(6)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_child_that_lived_long_resets_the_count() -> None:
    b = RestartBackoff(quick_seconds=10, first_seconds=0.5)
    b.died(1), b.died(1)
    assert b.died(60) == 0.0 and b.quick_deaths == 0
    assert b.died(1) == 0.0


def test_a_long_life_resets_the_count_however_the_child_ended() -> None:
    """A child recycled (or stopped) after a long life: the next quick death is a first one."""
    b = RestartBackoff(quick_seconds=10, first_seconds=0.5)
    b.died(1), b.died(1)
    b.lived(3)
    assert b.quick_deaths == 2
    b.lived(60)
    assert b.died(1) == 0.0
