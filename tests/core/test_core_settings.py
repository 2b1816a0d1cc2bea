"""django_delayqueue.core.settings: per-queue settings, validation and the retry backoff."""

from __future__ import annotations

import math

import pytest

from django_delayqueue.core import ConfigurationError, QueueSettings


def test_defaults() -> None:
    s = QueueSettings()
    assert s.max_attempts == 5
    assert s.visibility_timeout == 60.0
    assert s.max_payload_bytes == 512 * 1024
    assert s.promote_batch == 1000
    assert s.paused is False
    assert s.problems() == []


@pytest.mark.parametrize(
    "changes,problem",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_base": -1}, "backoff_base"),
        ({"backoff_base": 10, "backoff_max": 5}, "backoff_max"),
        ({"visibility_timeout": 0.5}, "visibility_timeout"),
        ({"claim_batch": 0}, "claim_batch"),
        ({"claim_batch": 10_001}, "claim_batch"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 1025}, "concurrency"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"max_payload_bytes": 64 * 1024 * 1024 + 1}, "max_payload_bytes"),
        ({"promote_batch": 0}, "promote_batch"),
        ({"promote_batch": 100_001}, "promote_batch"),
    ],
)
def test_invalid_settings_are_refused_by_name(changes: dict, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        QueueSettings(**changes)


SECONDS = ["backoff_base", "backoff_max", "visibility_timeout", "soft_time_limit", "time_limit"]


@pytest.mark.parametrize("name", [*SECONDS, "abort_grace_seconds"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_wherever_a_number_of_seconds_is_read(
    name: str, value: float
) -> None:
    """Issue 37: a visibility_timeout of NaN passed (every comparison with NaN is false), as
    did a backoff_max or abort_grace of NaN, and an infinite backoff_max or visibility."""
    with pytest.raises(ConfigurationError) as caught:
        QueueSettings(**{name: value})
    assert str(caught.value) == f"{name} must be a finite number of seconds, not {value!r}"


def test_nan_lateness_warning_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError) as caught:
        QueueSettings(lateness_warning_ms=math.nan)
    said = "lateness_warning_ms must be a finite number of milliseconds, not nan"
    assert str(caught.value) == said


def test_replace_validates_too() -> None:
    s = QueueSettings()
    assert s.replace(max_attempts=2).max_attempts == 2
    assert s.max_attempts == 5  # frozen: the original is unchanged
    with pytest.raises(ConfigurationError, match="max_attempts"):
        s.replace(max_attempts=0)


def test_mapping_round_trip() -> None:
    s = QueueSettings(max_attempts=3, backoff_base=0.5, paused=True)
    assert QueueSettings.from_mapping(s.to_mapping()) == s


def test_from_mapping_names_unknown_settings() -> None:
    with pytest.raises(ConfigurationError, match="unknown queue settings: bogus, nope"):
        QueueSettings.from_mapping({"nope": 1, "bogus": 2, "max_attempts": 3})


@pytest.mark.parametrize("attempt,full", [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (30, 10.0)])
def test_backoff_doubles_with_jitter_and_is_capped(attempt: int, full: float) -> None:
    s = QueueSettings(backoff_base=2.0, backoff_max=10.0)
    delays = [s.backoff(attempt) for _ in range(300)]
    assert all(full / 2 <= d <= full for d in delays)
    # Jitter: failures that happened together do not all come back together.
    assert len(set(delays)) > 1


def test_backoff_of_zero_base_is_zero() -> None:
    s = QueueSettings(backoff_base=0, backoff_max=0)
    assert s.backoff(1) == 0 and s.backoff(9) == 0


def test_backoff_of_a_nonsense_attempt_is_the_base() -> None:
    s = QueueSettings(backoff_base=1.0, backoff_max=100.0)
    assert 0.5 <= s.backoff(0) <= 1.0
