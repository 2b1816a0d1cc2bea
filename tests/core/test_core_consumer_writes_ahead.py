"""Handlers' writes (a task's result) sent beside the round trip: Redis has each before its
message is acked, a write that fails is sent again, and its ``then`` runs once the ack landed
(django_delayqueue.core.consumer.rounds.writes_ahead)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from core_consumer_support import T0

from django_delayqueue.core.consumer.outcomes import ACK, Outcome, WritesWithAck
from django_delayqueue.core.consumer.rounds import recording
from django_delayqueue.core.consumer.rounds.recording import UnrecordedOutcomes
from django_delayqueue.core.consumer.rounds.writes_ahead import WritesAhead
from django_delayqueue.core.scripts.calls import ScriptBatch


def task_outcomes(q: Any, count: int, then: list[Any]) -> list[Outcome]:
    """``count`` claimed messages acked by handlers that left a result write (as a task's
    success), each record as enqueue leaves it; ``then`` collects (id, reply, acked then)."""
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(count)])
    q.promote()
    outcomes = []
    for m in sorted(q.claim(count), key=lambda m: m.id):
        q.client.hset(q.keys.task_result(m.id), "enqueued", "{}")
        call = q.record_write_call(
            m.id, order=3, in_order=["status", "SUCCESSFUL"], required="enqueued", mergeable=True
        )

        def noted(reply: Any, message_id: str = m.id) -> None:
            then.append((message_id, reply, not q.client.hexists(q.keys.messages, message_id)))

        outcomes.append(Outcome(m, ACK, T0, T0, writes=WritesWithAck(call, noted)))
    return outcomes


def one_round(client: redis.Redis, unrecorded: UnrecordedOutcomes, q: Any) -> None:
    """What a consumer's round does with its outcomes: add them, send ahead, run, read."""
    batch = ScriptBatch()
    flush = unrecorded.add_to(batch, [q], T0)
    unrecorded.send_ahead(client)
    unrecorded.read(flush, batch.run(client, raise_errors=False), T0)


def test_a_result_sent_ahead_lands_before_its_ack_which_rides_on_the_next_round(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    ahead = WritesAhead()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0, writes_ahead=ahead)
    then: list[Any] = []
    unrecorded.extend(task_outcomes(q, 3, then))
    one_round(redis_client, unrecorded, q)
    # The first round sent the results beside its pipeline and acked nothing.
    assert q.counts()["unack"] == 3 and len(unrecorded) == 3
    assert ahead.wait_sent(5.0)
    assert unrecorded.recording_due()  # its acks are due now, not at the next poll
    for i in range(3):  # Redis has every result while its message is still in flight
        assert redis_client.hget(q.keys.task_result(f"m{i}"), "status") == b"SUCCESSFUL"
    one_round(redis_client, unrecorded, q)
    assert q.counts()["unack"] == 0 and len(unrecorded) == 0
    # Each then() ran once, after its ack had landed (a task_finished receiver finds its
    # message gone, as when the write and the ack share a pipeline).
    assert sorted(then) == [("m0", 1, True), ("m1", 1, True), ("m2", 1, True)]
    ahead.close()


def test_a_result_whose_send_failed_is_sent_again_and_its_message_acked_only_then(
    redis_client: redis.Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage on the writes' own connection: nothing is acked, the writes go again with a
    later round (after the queue's pause, none here), and the acks only after Redis has them."""
    monkeypatch.setattr(recording, "FAILED_QUEUE_PAUSE_SECONDS", 0.0)
    q = make_queue()
    ahead = WritesAhead()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0, writes_ahead=ahead)
    then: list[Any] = []
    unrecorded.extend(task_outcomes(q, 2, then))
    batch = ScriptBatch()
    flush = unrecorded.add_to(batch, [q], T0)
    down = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    unrecorded.send_ahead(down)
    unrecorded.read(flush, batch.run(redis_client, raise_errors=False), T0)
    assert ahead.wait_sent(10.0)
    assert q.counts()["unack"] == 2
    one_round(redis_client, unrecorded, q)  # takes the failure in: its queue pauses
    assert q.counts()["unack"] == 2 and then == []
    assert redis_client.hget(q.keys.task_result("m0"), "status") is None
    one_round(redis_client, unrecorded, q)  # sends them again
    assert ahead.wait_sent(5.0) and q.counts()["unack"] == 2
    one_round(redis_client, unrecorded, q)
    assert q.counts()["unack"] == 0 and len(unrecorded) == 0
    assert sorted(then) == [("m0", 1, True), ("m1", 1, True)]
    ahead.close()


def test_at_a_stop_the_results_in_flight_are_waited_for_and_acked(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A stop's rounds (force) first wait for what was sent ahead, then record the rest in
    the round trip itself: nothing is left in flight."""
    q = make_queue()
    ahead = WritesAhead()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0, writes_ahead=ahead)
    then: list[Any] = []
    unrecorded.extend(task_outcomes(q, 2, then))
    one_round(redis_client, unrecorded, q)  # sent ahead
    unrecorded.extend(task_outcomes(q, 0, then))
    batch = ScriptBatch()
    flush = unrecorded.add_to(batch, [q], T0, force=True)
    unrecorded.read(flush, batch.run(redis_client, raise_errors=False), T0)
    assert q.counts()["unack"] == 0 and len(unrecorded) == 0
    assert sorted(then) == [("m0", 1, True), ("m1", 1, True)]
    ahead.close()


def test_without_writes_ahead_a_result_and_its_ack_share_the_round_trip(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    then: list[Any] = []
    unrecorded.extend(task_outcomes(q, 2, then))
    one_round(redis_client, unrecorded, q)
    assert q.counts()["unack"] == 0 and len(unrecorded) == 0
    assert sorted(then) == [("m0", 1, True), ("m1", 1, True)]


def test_a_failed_send_pauses_its_queue_rather_than_making_every_round_due(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """Its reply makes one round due (to take it in); that round pauses the queue, as a round
    trip's failed calls do, instead of sending it again at once, round after round (review:
    3,825 rounds in 2 s against a Redis refusing the write for memory)."""
    q = make_queue()
    ahead = WritesAhead()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0, writes_ahead=ahead)
    unrecorded.extend(task_outcomes(q, 1, []))
    batch = ScriptBatch()
    flush = unrecorded.add_to(batch, [q], T0)
    unrecorded.send_ahead(redis.Redis(port=1, socket_connect_timeout=0.2))
    unrecorded.read(flush, batch.run(redis_client, raise_errors=False), T0)
    assert ahead.wait_sent(10.0) and unrecorded.recording_due()
    one_round(redis_client, unrecorded, q)  # takes the failure in
    assert not unrecorded.recording_due() and not ahead.pending()  # nothing sent again yet
    assert q.counts()["unack"] == 1 and len(unrecorded) == 1
    ahead.close()


def test_a_result_on_a_key_an_early_call_of_the_round_writes_goes_after_it_in_the_round_trip(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """write_soon's calls go before the same round's writes: a write sent ahead is not ordered
    with the round trip's pipeline (review: the early write landed last, 20 times in 20), so
    one on the same key goes in the round trip, after the early call, with its ack."""
    q = make_queue()
    ahead = WritesAhead()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0, writes_ahead=ahead)
    then: list[Any] = []
    [outcome] = task_outcomes(q, 1, then)
    key = q.keys.task_result(outcome.message.id)
    early = q.record_write_call(
        outcome.message.id, order=2, in_order=["status", "RUNNING"], mergeable=False
    )
    assert early.keys == [key]
    unrecorded.write_soon(q.name, early)
    unrecorded.extend([outcome])
    one_round(redis_client, unrecorded, q)
    assert not ahead.pending()  # nothing was sent ahead
    assert redis_client.hget(key, "status") == b"SUCCESSFUL"  # the early write first
    assert q.counts()["unack"] == 0 and then == [("m0", 1, True)]
    ahead.close()


def test_a_closed_sender_sends_what_it_is_handed_later(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A consumer run again after its stop hands its sender more: a thread sends it (review:
    a thread that had decided to end took no new job)."""
    q = make_queue()
    ahead = WritesAhead()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0, writes_ahead=ahead)
    then: list[Any] = []
    for _ in range(2):
        unrecorded.extend(task_outcomes(q, 1, then))
        one_round(redis_client, unrecorded, q)
        assert ahead.wait_sent(5.0)
        one_round(redis_client, unrecorded, q)
        unrecorded.close()
    assert q.counts()["unack"] == 0 and len(then) == 2
