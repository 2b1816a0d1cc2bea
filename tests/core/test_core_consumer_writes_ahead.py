"""Handlers' writes (a task's result) sent beside the round trip: Redis has each before its
message is acked, a write that fails is sent again, and its ``then`` runs once the ack landed
(django_delayqueue.core.consumer.rounds.writes_ahead)."""

from __future__ import annotations

from typing import Any

import redis
from core_consumer_support import T0

from django_delayqueue.core.consumer.outcomes import ACK, Outcome, WritesWithAck
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
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """An outage on the writes' own connection: nothing is acked, the writes go again with a
    later round, and the acks only after Redis has them."""
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
    one_round(redis_client, unrecorded, q)  # takes the failure in, sends them again
    assert q.counts()["unack"] == 2 and then == []
    assert redis_client.hget(q.keys.task_result("m0"), "status") is None
    assert ahead.wait_sent(5.0)
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
