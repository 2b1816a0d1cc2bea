"""Outcomes waiting for the next round trip: flushed as acks, nacks and a journal entry."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from core_consumer_support import T0

from django_delayqueue.core.outcome import ACK, GARBAGE, RETRY, Outcome
from django_delayqueue.core.scripts import ScriptBatch
from django_delayqueue.core.unrecorded import UnrecordedOutcomes


def claimed_outcomes(q: Any, statuses: list[str]) -> list[Outcome]:
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(len(statuses))])
    q.promote()
    messages = sorted(q.claim(len(statuses)), key=lambda m: m.id)
    return [
        Outcome(m, status, T0, T0, reason="" if status == ACK else f"{status} {m.id}")
        for m, status in zip(messages, statuses, strict=True)
    ]


def flush(client: redis.Redis, unrecorded: UnrecordedOutcomes, now: int = T0) -> None:
    batch = ScriptBatch()
    calls = unrecorded.add_to(batch, now)
    unrecorded.settle(calls, batch.run(client, raise_errors=False))


def test_one_flush_records_acks_retries_burials_and_a_journal_entry(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [ACK, RETRY, GARBAGE]))
    with caplog.at_level(logging.WARNING):
        flush(redis_client, unrecorded)
    assert "used its last attempt" not in caplog.text  # a burial is not a last retry
    assert len(unrecorded) == 0
    assert q.counts()["unack"] == 0
    assert redis_client.zrange(q.keys.retry, 0, -1) == [b"m1"]
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m2"]
    [(_, fields)] = redis_client.xrange(q.keys.journal)
    assert fields[b"n"] == b"3"


def test_outcomes_stay_until_a_flush_succeeds(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [ACK, ACK]))
    redis_client.set(q.keys.journal, "not a stream")  # the journal call fails
    with caplog.at_level(logging.ERROR):
        flush(redis_client, unrecorded)
    assert len(unrecorded) == 2
    assert "could not record 2 outcome(s)" in caplog.text
    redis_client.delete(q.keys.journal)
    flush(redis_client, unrecorded)
    assert len(unrecorded) == 0
    assert q.counts()["unack"] == 0
    assert redis_client.xlen(q.keys.journal) == 1


def test_a_retry_that_used_the_last_attempt_is_logged(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue(max_attempts=1)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    unrecorded.extend(claimed_outcomes(q, [RETRY]))
    with caplog.at_level(logging.WARNING):
        flush(redis_client, unrecorded)
    assert "message m0 used its last attempt: retry m0" in caplog.text
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m0"]
    assert not redis_client.exists(q.keys.journal)  # journal_maxlen=0: no journal
