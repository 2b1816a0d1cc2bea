"""Outcomes waiting for the next round trip: flushed as acks, nacks and a journal entry."""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import replace
from typing import Any

import pytest
import redis
from core_consumer_support import T0
from waiting import TIMEOUT

from django_delayqueue.core.consumer.outcomes import ACK, GARBAGE, RETRY, Outcome, WhileRunning
from django_delayqueue.core.consumer.rounds.recording import JOURNAL_TRIES, UnrecordedOutcomes
from django_delayqueue.core.journal import JOURNAL_FIELDS
from django_delayqueue.core.scripts.calls import ScriptBatch


def claimed_outcomes(q: Any, statuses: list[str]) -> list[Outcome]:
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(len(statuses))])
    q.promote()
    messages = sorted(q.claim(len(statuses)), key=lambda m: m.id)
    return [
        Outcome(m, status, T0, T0, reason="" if status == ACK else f"{status} {m.id}")
        for m, status in zip(messages, statuses, strict=True)
    ]


def flush(
    client: redis.Redis, unrecorded: UnrecordedOutcomes, queues: list[Any], now: int = T0
) -> None:
    """One flush of ``queues``, as the consumer sends it; ``force`` skips a failed queue's
    pause."""
    batch = ScriptBatch()
    calls = unrecorded.add_to(batch, queues, now, force=True)
    unrecorded.read(calls, batch.run(client, raise_errors=False), now)


def journal_rows(client: redis.Redis, q: Any) -> list[list[Any]]:
    return [row for _, f in client.xrange(q.keys.journal) for row in json.loads(f[b"o"])]


def test_one_flush_records_acks_retries_burials_and_a_journal_entry(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The failures' journal rows go with the next flush, once their nacks said what became of
    the messages (an abort that came first makes them an abort's)."""
    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [ACK, RETRY, GARBAGE]))
    with caplog.at_level(logging.WARNING):
        flush(redis_client, unrecorded, [q])
    assert "used its last attempt" not in caplog.text  # a burial is not a last retry
    assert q.counts()["unack"] == 0
    assert redis_client.zrange(q.keys.retry, 0, -1) == [b"m1"]
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m2"]
    [(_, fields)] = redis_client.xrange(q.keys.journal)
    assert fields[b"n"] == b"1"  # the ack's
    assert len(unrecorded) == 2 and unrecorded.journal_due()
    assert unrecorded.unrecorded_messages("q") == []  # their state changes are in Redis
    flush(redis_client, unrecorded, [q])
    assert len(unrecorded) == 0 and not unrecorded.journal_due()
    assert [row[0] for row in journal_rows(redis_client, q)] == ["m0", "m1", "m2"]


def test_a_failure_on_the_last_attempt_is_journalled_as_garbage(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """nack.lua buries a failure with no attempts left, even one asking for a retry delay:
    the journal (what queuestats and the metrics count) must say garbage, not retry."""
    q = make_queue(max_attempts=1)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    outcomes = claimed_outcomes(q, [RETRY, RETRY])
    outcomes[1].delay = 30.0  # what raising Retry(delay=30) gives
    unrecorded.extend(outcomes)
    flush(redis_client, unrecorded, [q])
    flush(redis_client, unrecorded, [q])  # the journal rows, once the nacks replied
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m0", b"m1"]
    assert [row[6] for row in journal_rows(redis_client, q)] == [GARBAGE, GARBAGE]

    roomy = make_queue("roomy", max_attempts=2)  # a first failure of two attempts: a retry
    unrecorded = UnrecordedOutcomes([roomy], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(roomy, [RETRY]))
    flush(redis_client, unrecorded, [roomy])
    flush(redis_client, unrecorded, [roomy])
    assert [row[6] for row in journal_rows(redis_client, roomy)] == [RETRY]


def test_a_failed_journal_write_is_sent_again_alone(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [ACK, ACK]))
    redis_client.set(q.keys.journal, "not a stream")  # the journal call fails
    with caplog.at_level(logging.ERROR):
        flush(redis_client, unrecorded, [q])
    assert "queue q: could not record 2 outcome(s)" in caplog.text
    assert len(unrecorded) == 2  # their journal rows are still owed...
    assert q.counts()["unack"] == 0  # ...but the acks went through, and are not sent again
    redis_client.delete(q.keys.journal)
    flush(redis_client, unrecorded, [q])
    assert len(unrecorded) == 0
    assert sorted(row[0] for row in journal_rows(redis_client, q)) == ["m0", "m1"]
    flush(redis_client, unrecorded, [q])  # nothing left: no second copy of any row
    assert len(journal_rows(redis_client, q)) == 2


def test_one_broken_queue_does_not_hold_back_another(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    broken, healthy = make_queue("broken"), make_queue("healthy")
    unrecorded = UnrecordedOutcomes([broken, healthy], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(broken, [ACK]))
    unrecorded.extend(claimed_outcomes(healthy, [ACK, RETRY, ACK, ACK, ACK]))
    redis_client.set(broken.keys.journal, "not a stream")
    for _ in range(2):  # JOURNAL_TRIES is 3: the broken queue's row is still kept after two
        flush(redis_client, unrecorded, [broken, healthy])
    # Every outcome of the healthy queue recorded once: five rows, not five per round.
    assert len(journal_rows(redis_client, healthy)) == 5
    assert healthy.counts()["unack"] == 0
    assert len(unrecorded) == 1  # only the broken queue's journal row is owed


def test_a_journal_row_that_keeps_failing_is_dropped_with_an_error(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [ACK]))
    redis_client.set(q.keys.journal, "not a stream")
    with caplog.at_level(logging.ERROR):
        for _ in range(JOURNAL_TRIES):
            flush(redis_client, unrecorded, [q])
    assert len(unrecorded) == 0  # memory does not grow for ever
    assert "journal rows of 1 delivery(ies) dropped" in caplog.text and "m0" in caplog.text
    assert q.counts()["unack"] == 0


def test_a_nack_its_script_refuses_is_dropped_and_left_to_the_reaper(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """nack.lua refusing its keys (here the retry set is a string): the outcome was kept and
    sent again every pause, its journal row owed, its message's deadline extended, until the
    consumer stopped. It is dropped as other refused calls are, logged with the message's id;
    the message stays in flight, where the reaper finds it (at-least-once)."""
    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [RETRY, GARBAGE]))
    redis_client.set(q.keys.retry, "not a zset")
    redis_client.set(q.keys.garbage, "not a zset")
    with caplog.at_level(logging.ERROR):
        flush(redis_client, unrecorded, [q])
    assert len(unrecorded) == 0 and not unrecorded.journal_due()
    assert unrecorded.unrecorded_messages("q") == []  # its deadline no longer extended
    for message_id in ("m0", "m1"):
        said = [
            r.getMessage() for r in caplog.records if f"message {message_id}:" in r.getMessage()
        ]
        assert len(said) == 1, said
        assert "nack refused, left in flight for the reaper" in said[0] and "WRONGTYPE" in said[0]
    redis_client.delete(q.keys.retry, q.keys.garbage)  # repaired
    assert q.counts()["unack"] == 2  # still in flight: the reaper's once their lease ends
    assert q.reap(now_ms=T0 + 3_600_000).retried == 2
    flush(redis_client, unrecorded, [q])
    assert not redis_client.exists(q.keys.journal)  # no row for a nack that never ran


def test_a_failed_queue_waits_its_pause_before_the_next_try(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [ACK]))
    redis_client.set(q.keys.journal, "not a stream")
    flush(redis_client, unrecorded, [q])
    # Without force, the next round leaves it alone (no error logged every round trip).
    assert unrecorded.add_to(ScriptBatch(), [q], T0) == []


def test_a_retry_that_used_the_last_attempt_is_logged(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue(max_attempts=1)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    unrecorded.extend(claimed_outcomes(q, [RETRY]))
    with caplog.at_level(logging.WARNING):
        flush(redis_client, unrecorded, [q])
    assert "message m0 used its last attempt: retry m0" in caplog.text
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m0"]
    assert not redis_client.exists(q.keys.journal)  # journal_maxlen=0: no journal


def test_counting_while_handler_threads_write_soon_never_races(make_queue: Any) -> None:
    """The loop asks ``len()`` (``_busy()``, outside its error handling) while handler threads
    add early writes (a task's RUNNING, a tick's record). Iterated without the lock while a
    thread added a queue to it, the dict raised "dictionary changed size during iteration" and
    crashed ``run()``. Threads adding many names at a tiny switch interval make it near certain.
    """
    call = make_queue().promote_call(T0)
    unrecorded = UnrecordedOutcomes([], journal_maxlen=0)
    errors: list[BaseException] = []

    def handler_thread(n: int) -> None:
        for i in range(2000):  # a name per call: every call adds a key
            unrecorded.write_soon(f"queue-{n}-{i}", call)

    threads = [threading.Thread(target=handler_thread, args=(n,)) for n in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            try:
                len(unrecorded)  # what the loop asks
            except RuntimeError as e:
                errors.append(e)
                break
    finally:
        for t in threads:
            t.join()
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(unrecorded) == 4 * 2000


def running_record_call(q: Any) -> Any:
    """An early write as a task's RUNNING (or a recurring tick's last run) leaves it."""
    from django_delayqueue.core.scripts.calls import LuaScript, ScriptCall

    key = q.keys.task_result("t1")
    fields = '[[],["status","RUNNING"],[],[]]'  # write_record.lua's ARGV[3]
    return ScriptCall(LuaScript.named("write_record"), [key], [0, 2, fields])


@pytest.mark.parametrize("how", ["round", "shutdown flush"])
def test_an_outage_keeps_the_early_writes(
    redis_client: redis.Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A round whose whole pipeline fails never reaches settle(): the early writes it carried
    (taken out of the pending ones to build it) were lost, and the RUNNING record never
    written. They stay until a reply says they ran."""
    from django_delayqueue.core.consumer.loop import Consumer
    from django_delayqueue.core.errors import RedisUnavailable

    q = make_queue()
    consumer = Consumer([q], lambda m: None)
    try:
        consumer.step()
        consumer.write_soon(q, running_record_call(q))

        def outage(self: ScriptBatch, client: Any, raise_errors: bool = True) -> Any:
            raise RedisUnavailable("simulated outage")

        with monkeypatch.context() as patched:
            patched.setattr(ScriptBatch, "run", outage)
            with pytest.raises(RedisUnavailable):
                consumer.step() if how == "round" else consumer._round_trip.record_only(
                    q.clock.now_ms(), force=True
                )
        assert len(consumer._unrecorded) == 1
        consumer.step() if how == "round" else consumer._round_trip.record_only(
            q.clock.now_ms(), force=True
        )
        assert len(consumer._unrecorded) == 0
        assert redis_client.hget(q.keys.task_result("t1"), "status") == b"RUNNING"
    finally:
        consumer._threads.close()
        consumer._waiter.close()


def test_an_early_write_refused_by_its_script_is_dropped_once(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Kept until settled, an early write the script refuses (a key of the wrong type) still
    leaves at once, logged, and the one behind it is written."""
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    redis_client.set(q.keys.task_result("t1"), "not a hash")
    unrecorded.write_soon(q.name, running_record_call(q))
    other = running_record_call(q)
    other.keys[0] = q.keys.task_result("t2")
    unrecorded.write_soon(q.name, other)
    with caplog.at_level(logging.ERROR):
        flush(redis_client, unrecorded, [q])
    assert "an early write dropped" in caplog.text
    assert len(unrecorded) == 0
    assert redis_client.hget(q.keys.task_result("t2"), "status") == b"RUNNING"


def test_a_write_handed_over_while_the_loop_holds_the_lock_does_not_wait_and_goes(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A handler thread hands a task's RUNNING over for every task it starts: it never waits
    for the recorder's lock (the loop holds it building a round), and the call is counted and
    sent with the next round, after those handed over before it."""
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    first, second = running_record_call(q), running_record_call(q)
    second.keys[0] = q.keys.task_result("t2")
    unrecorded.write_soon(q.name, first)
    handed = threading.Event()
    with unrecorded._lock:  # held, as by the loop's add_to
        thread = threading.Thread(
            target=lambda: (unrecorded.write_soon(q.name, second), handed.set())
        )
        thread.start()
        assert handed.wait(TIMEOUT)  # never gets the lock before this block ends
    thread.join()
    assert len(unrecorded) == 2
    batch = ScriptBatch()
    flushed = unrecorded.add_to(batch, [q], q.clock.now_ms())
    assert [entries[0] for _, kind, entries, _ in flushed if kind == "early"] == [first, second]
    unrecorded.read(flushed, batch.run(q.client, raise_errors=False), q.clock.now_ms())
    assert len(unrecorded) == 0
    for record in ("t1", "t2"):
        assert redis_client.hget(q.keys.task_result(record), "status") == b"RUNNING"


def test_recording_what_is_left_at_a_stop_ends_on_a_clock_that_stands_still() -> None:
    """The shutdown's last writes are bounded in tries too: on an injected clock that never
    moves (a test's), a server that never answers made record_left loop for ever."""
    from django_delayqueue.core import Message, Queue
    from django_delayqueue.core.consumer.loop import Consumer
    from django_delayqueue.embedded import free_port

    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    q = Queue(down, "left")
    consumer = Consumer([q], lambda m: None)
    try:
        consumer._unrecorded.extend(
            [Outcome(Message("m", "left", None, 0, 0, 1, "1", 0), ACK, 0, 0)]
        )
        done = threading.Thread(
            target=consumer._round_trip.record_left, args=(0.2, lambda: 0.0), daemon=True
        )
        done.start()
        done.join(60)  # one try: redis-py's own retries on a refused connection take seconds
        assert not done.is_alive()
        assert len(consumer._unrecorded) == 1  # not recorded: delivered again, as logged
    finally:
        consumer._threads.close()
        consumer._waiter.close()


def test_an_error_reply_to_the_acks_wait_is_logged_not_raised(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With MIN_REPLICAS, a WAIT answering with an error (not a DelayQueueError) escaped
    read() and took the round's claimed messages with it (left in unack, an attempt lost)."""
    from django_delayqueue.core import Queue
    from django_delayqueue.core.consumer.rounds.recording import _confirm_acks
    from django_delayqueue.core.replication import ReplicaAck

    q = Queue(redis_client, "acked", replicas=ReplicaAck(1))

    def refused(what: str, result: Any = None) -> None:
        raise redis.exceptions.ResponseError("ERR WAIT cannot be used with replica instances")

    monkeypatch.setattr(q, "confirm_replicas", refused)
    with caplog.at_level(logging.WARNING):
        _confirm_acks([(q, "ack", [], 0)])
    assert "a failover now may deliver them again" in caplog.text


def test_the_task_results_of_a_round_go_as_one_call_and_a_bad_key_fails_only_its_own(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes left for the acks by write_records.lua calls (a task's SUCCESSFUL) merge into
    one call per queue; each gets its own reply (its ``then`` called with it), and one whose
    key holds the wrong type is dropped, logged, while the others land."""
    from django_delayqueue.core.consumer.outcomes import WritesWithAck

    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    outcomes = claimed_outcomes(q, [ACK, ACK, ACK])
    redis_client.set(q.keys.task_result("m1"), "not a hash")
    redis_client.hset(q.keys.task_result("m2"), "enqueued", "{}")
    replies: dict[str, Any] = {}
    for o in outcomes:
        call = q.record_write_call(
            o.message.id, order=3, in_order=["status", "SUCCESSFUL"], required="enqueued",
            mergeable=True,
        )  # fmt: skip
        o.writes = WritesWithAck(call, lambda reply, i=o.message.id: replies.setdefault(i, reply))
    unrecorded.extend(outcomes)
    batch = ScriptBatch()
    calls = unrecorded.add_to(batch, [q], T0, force=True)
    writes = [c for c in batch.calls if c.script.name == "write_records"]
    assert len(writes) == 1 and len(writes[0].keys) == 3  # one call carries the three
    with caplog.at_level(logging.ERROR):
        unrecorded.read(calls, batch.run(redis_client, raise_errors=False), T0)
    assert "message m1: handler's write dropped: WRONGTYPE" in caplog.text
    assert replies == {"m0": -1, "m2": 1}  # m0's record lacks "enqueued": nothing written
    assert not redis_client.exists(q.keys.task_result("m0"))
    assert redis_client.hget(q.keys.task_result("m2"), "status") == b"SUCCESSFUL"
    assert len(unrecorded) == 0 and q.counts()["unack"] == 0


def test_what_is_left_at_a_stop_is_logged_as_outcomes_apart_from_handed_over_writes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An early write (write_soon) left at a stop is lost, not delivered again: the log says
    which is which."""
    from django_delayqueue.core import Message, Queue
    from django_delayqueue.core.consumer.loop import Consumer
    from django_delayqueue.embedded import free_port

    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    q = Queue(down, "left")
    consumer = Consumer([q], lambda m: None)
    try:
        consumer._unrecorded.extend(
            [Outcome(Message("m", "left", None, 0, 0, 1, "1", 0), ACK, 0, 0)]
        )
        consumer.write_soon(q, running_record_call(q))
        with caplog.at_level(logging.WARNING, logger="django_delayqueue"):
            consumer._round_trip.record_left(0.2, lambda: 0.0)
        assert "1 outcome(s) not recorded: those messages will be delivered again" in caplog.text
        assert "1 write(s) handed over by handlers not sent" in caplog.text
    finally:
        consumer._threads.close()
        consumer._waiter.close()


class RunningWrite(WhileRunning):
    """A handler's write while it runs, as a task's attempt hands its RUNNING over."""

    def __init__(self, q: Any) -> None:
        self.q = q
        self.built = 0

    def call(self) -> Any:
        self.built += 1
        return running_record_call(self.q)


def test_a_write_while_running_goes_with_the_next_round_only_if_its_handler_still_runs(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A task that ended before the next round never has its RUNNING built nor sent (its
    result says it all); one still running has it sent by that round, once, and kept as
    ``taken`` (its result leaves it out if both go together)."""
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=0)
    ended, running = RunningWrite(q), RunningWrite(q)
    unrecorded.write_soon(q.name, ended)
    unrecorded.write_soon(q.name, running)
    ended.ended = True
    assert unrecorded.left() == (0, 0)  # no write yet: only a handler's wish
    flush(redis_client, unrecorded, [q])
    assert ended.built == 0 and ended.taken is None
    assert running.built == 1 and running.taken is not None
    assert redis_client.hget(q.keys.task_result("t1"), "status") == b"RUNNING"
    flush(redis_client, unrecorded, [q])
    assert running.built == 1 and len(unrecorded) == 0  # taken once


def test_the_journal_row_carries_the_limit_wait_apart_from_lateness(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A flow limit's hold, as the claim that took the message said, is the row's 9th
    field (JOURNAL_FIELDS' limit_wait_ms): what Spark's report takes out of the lateness."""
    q = make_queue()
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    held, free = claimed_outcomes(q, [ACK, ACK])
    # The first message's claim said it waited 250 ms on a limit; the second's, none: 0.
    held = replace(held, message=replace(held.message, limit_wait_ms=250))
    unrecorded.extend([held, free])
    flush(redis_client, unrecorded, [q])
    rows = {row[0]: row for row in journal_rows(redis_client, q)}
    assert len(JOURNAL_FIELDS) == 9 and JOURNAL_FIELDS[8] == "limit_wait_ms"
    assert (len(rows["m0"]), rows["m0"][8], rows["m1"][8]) == (9, 250, 0)


def test_an_abort_that_lands_before_a_failure_is_recorded_is_journalled_and_logged_as_one(
    redis_client: redis.Redis, make_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36 §4: an abort that lands after a handler was stopped at its time limit (or
    failed) and before its nack wins: nack.lua dead-letters it as aborted. Before, the journal
    said a retry (TimeLimitExceeded) and the log "used its last attempt: time limit exceeded"
    on attempt 1 of 3."""
    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    stopped, rejected = claimed_outcomes(q, [RETRY, GARBAGE])
    stopped.reason, stopped.error = "time limit exceeded (2 s)", "TimeLimitExceeded"
    rejected.error = "Reject"
    unrecorded.extend([stopped, rejected])
    assert q.abort("m0", "by staff").running and q.abort("m1").running
    with caplog.at_level(logging.WARNING):
        flush(redis_client, unrecorded, [q])
        flush(redis_client, unrecorded, [q])
    assert len(unrecorded) == 0
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m0", b"m1"]
    assert redis_client.hget(q.keys.reasons, "m0") == b"aborted: by staff"
    assert redis_client.hget(q.keys.reasons, "m1") == b"aborted"
    rows = [(row[0], row[5], row[6], row[7]) for row in journal_rows(redis_client, q)]
    assert rows == [("m0", 1, GARBAGE, "Aborted"), ("m1", 1, GARBAGE, "Aborted")]
    assert "used its last attempt" not in caplog.text
    # The log line names the dead letter's reason, the abort's own included (issue 36 §4).
    assert (
        "message m0 was aborted before its failure was recorded (time limit exceeded (2 s)): "
        "dead-lettered as aborted: by staff, not retried" in caplog.text
    )
    assert (
        "message m1 was aborted before its failure was recorded (garbage m1): "
        "dead-lettered as aborted, not retried" in caplog.text
    )


def test_an_abort_learnt_from_the_nack_counts_as_an_abort_in_the_delivery_timings(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """Issue 36 §4: the outcome counts (the metrics, the admin's charts) counted a delivery
    aborted before its nack as what its handler did (a retry, a rejection) before the nack
    said it was aborted. A failure now counts once its nack replied, as a direct abort does:
    ``stopped``; one nack.lua did not find aborted counts as before."""
    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    stopped, rejected, failed = claimed_outcomes(q, [RETRY, GARBAGE, RETRY])
    stopped.error, rejected.error, failed.error = "ValueError", "Reject", "ValueError"
    unrecorded.extend([stopped, rejected, failed])
    assert q.abort("m0", "by staff").running and q.abort("m1").running
    flush(redis_client, unrecorded, [q])
    counts = unrecorded.timings._counts[q.name]
    assert counts.outcomes == {"ack": 0, "retry": 1, "dead": 0, "stopped": 2}
    assert counts.count("duration") == 3


def test_a_task_s_retry_buried_as_aborted_is_told_once_its_record_says_so(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """Issue 36: a task that failed with attempts left (its runner told no one it ended), then
    buried as aborted by its nack: the consumer is told (its Tasks side sends task_finished),
    once the record's FAILED write landed, not before (a receiver reading the result finds it
    FAILED). Not for a task rejected (buried on purpose) nor one on its last attempt: their
    runner told it as they ended; nor for a message that is not a task."""
    q = make_queue(max_attempts=3)
    told: list[tuple[str, str, str]] = []
    unrecorded = UnrecordedOutcomes(
        [q],
        journal_maxlen=100,
        retry_buried=lambda q, m, reason: told.append((q.name, m.id, reason)),
    )
    retried, rejected, last, plain = claimed_outcomes(q, [RETRY, GARBAGE, RETRY, RETRY])
    for o in (retried, rejected, last):
        o.message = replace(o.message, task=True)
    last.message = replace(last.message, attempt=3)
    unrecorded.extend([retried, rejected, last, plain])
    for m in ("m0", "m1", "m2", "m3"):
        assert q.abort(m, "by staff").running
    flush(redis_client, unrecorded, [q])  # the nacks: each buried as aborted
    assert redis_client.zrange(q.keys.garbage, 0, -1) == [b"m0", b"m1", b"m2", b"m3"]
    assert told == []  # the records' writes go with the next round
    flush(redis_client, unrecorded, [q])
    assert told == [(q.name, "m0", "aborted: by staff")]
    assert unrecorded.left() == (0, 0)
    flush(redis_client, unrecorded, [q])
    assert len(told) == 1


def test_a_nack_refused_by_a_replica_is_sent_again_once_it_is_promoted(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A failover: the server the consumer writes to is a replica for a moment and answers
    READONLY. That refusal passes; the nack must be kept and land once the server takes
    writes again, not be dropped to the reaper (which would use the lease, not the backoff)."""
    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [RETRY]))
    redis_client.execute_command("REPLICAOF", "127.0.0.1", "1")  # a master that never answers
    try:
        flush(redis_client, unrecorded, [q])
        assert len(unrecorded) == 1  # kept
    finally:
        redis_client.execute_command("REPLICAOF", "NO", "ONE")
    flush(redis_client, unrecorded, [q])  # the nack lands
    flush(redis_client, unrecorded, [q])  # then its journal row
    assert len(unrecorded) == 0
    assert q.counts()["unack"] == 0 and q.counts()["retry"] == 1


@pytest.mark.parametrize(
    "reply",
    [
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down",
        "MOVED 3999 127.0.0.1:6381",
        "ASK 3999 127.0.0.1:6381",
        "BUSY Redis is busy running a script.",
        "NOREPLICAS Not enough good replicas to write.",
    ],
)
def test_a_nack_refused_for_a_passing_reason_is_kept(make_queue: Any, reply: str) -> None:
    """redis-py parses these replies into classes of their own and strips their code from the
    text, so a check of the text alone took a failover's MASTERDOWN or a cluster's MOVED for a
    broken script and dropped the nack to the reaper."""
    from redis._parsers import BaseParser

    q = make_queue(max_attempts=3)
    unrecorded = UnrecordedOutcomes([q], journal_maxlen=100)
    unrecorded.extend(claimed_outcomes(q, [RETRY]))
    entries = unrecorded._entries[q.name]
    assert not unrecorded._nack_refused(q, entries, BaseParser.parse_error(reply))
    assert len(unrecorded) == 1
