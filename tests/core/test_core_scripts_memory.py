"""Every script on a Redis whose memory is full (used_memory above maxmemory, noeviction), on
each Redis version at hand (the suite's redis-server and the embedded extra's 6.2).

The consumer's transitions run (deliveries go on, and their acks free memory); what grows
memory is refused with RedisOutOfMemory and changes nothing at all. Redis refuses a script's
growing writes only until its first write (lua/includes/memory.lua): these tests hold every
script to that, so a change to a script's first write cannot quietly stop consumers on a full
server, or leave a transition half-done.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from memory_support import full, redis_binaries, server_of, snapshot

from django_delayqueue.core import ManualClock, Message, Queue, QueueSettings, RedisUnavailable
from django_delayqueue.core.consumer.outcomes import ACK, Outcome, journal_entry
from django_delayqueue.core.errors import RedisOutOfMemory
from django_delayqueue.core.recurring.keeper import record_tick_call, tick_run
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import (
    BUSIEST_KEYS,
    DEAD_LETTER_REASONS,
    DEAD_LETTERS_WITH_REASON,
    FLOW_STATE,
    HEARTBEAT,
    JOURNAL,
    RECORD_TIMINGS,
    SLOT_FREED,
)
from django_delayqueue.core.scripts.loader import script_names

T0 = 1_700_000_000_000


@pytest.fixture(params=redis_binaries())
def client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    with server_of(request.param) as (_, c):
        yield c


def queue(client: redis.Redis, clock: ManualClock | None = None) -> Queue:
    settings = QueueSettings(visibility_timeout=10, max_attempts=3)
    return Queue(client, "mem", clock=clock or ManualClock(T0), settings=settings)


def journal_call(q: Queue, message: Message) -> ScriptCall:
    row = journal_entry([Outcome(message, ACK, T0, T0 + 1)], q.settings.max_attempts)
    fields = [item for pair in row.items() for item in pair]
    return JOURNAL.call(q.keys, max_length=1000, fields=fields)


def record_call(q: Queue, message_id: str, status: str) -> ScriptCall:
    return q.record_write_call(message_id, order=1, in_order=["status", status])


# --- refused, changing nothing ----------------------------------------------------------------


def test_growing_writes_are_refused_with_out_of_memory_and_change_nothing(
    client: redis.Redis,
) -> None:
    q = queue(client)
    q.schedule({"n": 1}, id="old", delay=60)  # a waiting message with a taken id
    before = snapshot(client)
    refused = {
        "schedule": lambda: q.schedule({"n": 2}, id="new"),
        "schedule a due one": lambda: q.schedule({"n": 3}),
        "schedule a taken id": lambda: q.schedule({"n": 4}, id="old"),
        "replace with a new id": lambda: q.schedule({"n": 5}, id="fresh", replace=True),
        "send_once": lambda: q.send_once(q.prepare({"n": 6}), "token-1"),
        "schedule with a window": lambda: q.schedule({"n": 8}, id="w", unique_for=60),
        "replace with a window": lambda: q.schedule({"n": 9}, id="w", replace=True, unique_for=9),
        "send_once with a window": lambda: q.send_once(
            q.prepare({"n": 10}, id="w"), "token-2", unique_ms=60_000
        ),
        "task with its record": lambda: q.send_with_record(
            q.prepare({"n": 7}, id="t1"), q.keys.task_result("t1"), "{}"
        ),
        "journal": lambda: journal_call(q, Message("x", q.name, {}, T0, T0, 1, "1", T0)).run(
            client
        ),
        # Delivery timings are a measure: dropped by the consumer when Redis refuses them.
        "delivery timings": lambda: RECORD_TIMINGS.call(
            q.keys, minute=q.keys.timings_minute(1), ttl_seconds=60, increments=["l0", 1]
        ).run(client),
    }
    with full(client):
        for what, call in refused.items():
            with pytest.raises(RedisOutOfMemory) as caught:
                call()
            assert "out of memory" in str(caught.value), what
            assert isinstance(caught.value, RedisUnavailable)  # callers retry it as an outage
            assert snapshot(client) == before, f"{what} changed something"
    assert q.schedule({"n": 2}, id="new").created  # memory is back: taken again


# --- the consumer's transitions run -----------------------------------------------------------


def test_the_consumer_keeps_delivering_and_acknowledging_on_a_full_server(
    client: redis.Redis,
) -> None:
    clock = ManualClock(T0)
    q = queue(client, clock)
    for n in range(6):
        q.schedule({"n": n}, id=f"m{n}", delay=1)
    q.schedule({"n": "late"}, id="late", delay=3600)
    task_key = q.keys.task_result("m0")
    record_call(q, "m0", "READY").run(client)
    done = Message("done", q.name, {}, T0, T0, 1, "1", T0)
    journal_call(q, done).run(client)  # an entry stats.lua has not tallied yet
    client.hset(
        q.keys.recurrence_states, "nightly", f"{T0} signature 1"
    )  # a tick is recorded only for a live schedule
    clock.advance(2000)
    with full(client):
        assert q.promote().moved == 6
        claimed = q.claim(6)
        assert [m.id for m in claimed] == [f"m{n}" for n in range(6)]
        ok, failed, dropped, given_back, *_ = claimed
        assert q.extend(ok, failed, seconds=60) == 2
        record_call(q, "m0", "SUCCESSFUL").run(client)  # a task's result, with its ack
        # ... as a consumer's round sends it (write_records.lua, merged with the round's others)
        merged = q.record_write_call(
            "m0", order=2, in_order=["status", "SUCCESSFUL"], mergeable=True
        )
        assert merged.run(client) == [b"1"]  # its code: "1", written in order
        # Several in one call: the no-op write that lets it run goes before the first only,
        # and every record lands (Redis lets a script that wrote finish).
        for mid in ("m1", "m2"):
            record_call(q, mid, "READY").run(client)
        several = [
            q.record_write_call(mid, order=2, in_order=["status", "SUCCESSFUL"], mergeable=True)
            for mid in ("m1", "m2")
        ]
        lines = "\n".join(c.args[0] for c in several)
        both = ScriptCall(several[0].script, [c.keys[0] for c in several], [lines])
        assert both.run(client) == [b"11"]
        assert q.ack(ok) == 1
        assert q.nack(failed, delay=1, reason="boom") == 1
        assert q.bury(dropped, "poison")
        assert q.release(given_back) == 1
        run = tick_run(T0, T0 + 5, "ack", "")
        assert record_tick_call(q, "nightly", run).run(client) == 1
        heartbeat = HEARTBEAT.call(q.keys, now_ms=clock.now_ms(), forget_before_ms=0, consumer="c1")
        heartbeat.run(client)
        stats = q.activity_call(0, 100, 10).run(client)
        assert stats[0] == 1 and stats[4] == 1  # the journal entry tallied, one consumer alive
        clock.advance(60_000)
        assert q.reap().retried == 2  # the 5th and 6th claimed were never recorded: timed out
        assert q.counts() == {"pending": 1, "ready": 1, "unack": 0, "retry": 3, "garbage": 1}
    assert client.hget(task_key, "status") == b"SUCCESSFUL"
    assert client.hget(q.keys.tick_runs, "nightly") == run.encode()


def test_claims_under_flow_limits_run_on_a_full_server(client: redis.Redis) -> None:
    # Held back by a limit, a claim notes it (an HSET) when Redis is full too: consumers go
    # on delivering at the limit's pace, and waking each other for freed slots.
    clock = ManualClock(T0)
    q = queue(client, clock)
    q.settings = q.settings.replace(rate_limit="10/s burst 2", max_in_flight=2)
    for n in range(4):
        q.schedule({"n": n}, id=f"m{n}")
    with full(client):
        first = q.claim(4)
        assert len(first) == 2
        assert q.claim(4) == []  # held: the cap
        assert SLOT_FREED.call(q.keys, wake_channel=q.keys.wake_channel, now_ms=T0).run(client) == 1
        assert q.ack(*first) == 2
        clock.advance(ms=100)
        assert len(q.claim(4)) == 1  # the rate: one token after the burst
        held = FLOW_STATE.call(q.keys, now_ms=clock.now_ms()).run(client)
        assert held[0] == b"rate"


def test_the_busiest_keys_are_read_on_a_full_server(client: redis.Redis) -> None:
    q = queue(client, ManualClock(T0))
    for n in range(3):
        q.schedule({"n": n}, id=f"m{n}", key="hot")
    with full(client):
        raw = BUSIEST_KEYS.call(q.keys, top=10).run(client)
    assert raw == [1, 1, b"hot", 3, 0]


def test_dead_letters_are_read_by_reason_on_a_full_server(client: redis.Redis) -> None:
    q = queue(client, ManualClock(T0))
    q.schedule({"n": 1}, id="dead")
    (dead,) = q.claim(1)
    q.bury(dead, "poison")
    with full(client):
        assert DEAD_LETTER_REASONS.call(q.keys, most=10).run(client) == [
            1,
            1,
            b"poison",
            1,
            b"%d" % T0,
        ]
        assert DEAD_LETTERS_WITH_REASON.call(q.keys, most=10, reason="poison").run(client) == [
            b"dead"
        ]


def test_staff_actions_that_free_or_move_messages_run_on_a_full_server(
    client: redis.Redis,
) -> None:
    q = queue(client)
    for name in ("a", "b"):
        q.schedule({"n": name}, id=name)
    for name in ("c", "d"):
        q.schedule({"n": name}, id=name, delay=60)
    dead, other = q.claim(2)
    q.bury(dead, "poison")
    q.bury(other, "poison")
    q.schedule({"n": "e"}, id="e")
    (running,) = q.claim(1)
    with full(client):
        assert q.abort(running.id, "stop it").running  # a runaway handler, stopped
        assert q.bury(running, "whatever it did") and q.requeue(running.id) == 1
        assert q.cancel("c") == 1
        assert q.run_now("d") == 1
        assert q.requeue(dead.id) == 1
        assert q.purge(other.id) == 1
        assert q.counts() == {"pending": 0, "ready": 3, "unack": 0, "retry": 0, "garbage": 0}


def test_a_message_of_a_newer_format_is_left_and_counted_on_a_full_server(
    client: redis.Redis,
) -> None:
    """A consumer of an older release meets a newer envelope while memory is full: it leaves
    the message in retry (defer.lua) rather than holding it until its lease runs out, and the
    stats still count what waits (newer_waiting.lua) and what is overdue (overdue.lua)."""
    from django_delayqueue.core.envelope import ENVELOPE_FORMAT, encode_envelope, encode_payload
    from django_delayqueue.core.results import Prepared
    from django_delayqueue.core.scripts.contracts import NEWER_WAITING

    clock = ManualClock(T0)
    q = queue(client, clock)
    newer = ENVELOPE_FORMAT  # read by this release, not by one pinned to the format before
    envelope = encode_envelope(encode_payload({"n": 1}), T0, T0, format=newer)
    assert q.send_prepared(Prepared("new", T0, envelope)).created
    with full(client):
        assert q.claim(10, reads_format=newer - 1) == []
        assert q.counts() == {"pending": 0, "ready": 0, "unack": 0, "retry": 1, "garbage": 0}
        waiting = NEWER_WAITING.call(q.keys, most_entries=10).run(client)
        assert [int(x) for x in waiting] == [1, newer, 1]
        overdue = q.overdue_call(T0 + 3_600_000).run(client)  # the stats' read
        assert [int(x) for x in overdue] == [0, 1, 0]


def test_every_script_is_known_to_run_or_be_refused_when_memory_is_full() -> None:
    """A new script must be added to one of these lists, and to the tests above."""
    run_when_full = {
        "abort", "ack", "cancel", "claim", "counts", "extend", "heartbeat", "nack", "peek",
        "promote", "flow_state", "slot_freed", "busiest_keys",
        "purge", "reap", "record_tick", "release", "requeue", "run_now", "recurrence_states",
        "stats", "write_record", "write_records", "read_timings", "defer", "newer_waiting",
        "overdue",
        "dead_letter_reasons", "dead_letters_with_reason",
    }  # fmt: skip
    refused_when_full = {
        "advance_recurrence", "enqueue_task", "journal", "publish_recurrences", "replace",
        "schedule", "send_once", "schedule_unique", "record_timings", "progress",
    }  # fmt: skip
    assert set(script_names()) == run_when_full | refused_when_full


@pytest.mark.parametrize("binary", redis_binaries())
def test_a_tiny_maxmemory_refuses_schedules_clearly_and_loses_none_of_those_taken(
    binary: str,
) -> None:
    """A shop's 6,000 messages of 1 KB on a small Redis with noeviction: every call either
    stores its message or raises RedisOutOfMemory, and a consumer's acks make room again."""
    with server_of(binary, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction") as (_, c):
        q = queue(c)
        taken, refused = [], 0
        for n in range(6000):
            try:
                q.schedule({"text": "x" * 1000}, id=f"m{n}")
            except RedisOutOfMemory:
                refused += 1
                continue
            taken.append(f"m{n}")
        assert refused > 0 and taken  # it filled up, and said so
        assert c.hlen(q.keys.messages) == len(taken) == q.counts()["ready"]  # none lost
        assert c.info("stats")["evicted_keys"] == 0
        while claimed := q.claim(500):  # a consumer drains the queue: its acks free memory
            q.ack(*claimed)
        assert q.schedule({"text": "again"}, id="after").created
