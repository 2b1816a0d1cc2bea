"""A key of the wrong type never leaves a transition half-done.

Redis does not roll a script back when a command inside it fails, so a script that wrote to one
key and then hit a wrong-type key would leave a message half-moved (popped from ready but never
marked in flight: lost). The scripts check the types of the keys they are about to write before
their first write. This test breaks every key of a queue in turn, runs every operation against
a queue holding messages in every state, and requires that an operation either succeeds or
fails having changed nothing at all.

Bad values are broken too (a token counter that is not an integer, an attempt count that is not
a number): an operation that meets one either fails having changed nothing, or succeeds and
leaves every message in exactly one state (a message whose attempt count is unreadable goes to
the dead letters with a reason naming the value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis
from core_consumer_support import keeper_rounds

from django_delayqueue.core import ManualClock, Message, Queue, QueueSettings, ScriptFailed
from django_delayqueue.core.consumer.outcomes import ACK, Outcome, journal_entry
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.recurring import Recurrence, ScheduleKeeper
from django_delayqueue.core.recurring.keeper import record_tick_call, tick_run
from django_delayqueue.core.scripts.contracts import JOURNAL, NEWER_WAITING, RECURRENCE_STATES


@dataclass
class Held:
    """A queue with messages in every state; ``inflight`` is the claimed one (in unack)."""

    queue: Queue
    clock: ManualClock
    inflight: Message
    retrying: str
    pending: str


def populated(client: redis.Redis) -> Held:
    clock = ManualClock()
    q = Queue(client, "typed", clock=clock, settings=QueueSettings(visibility_timeout=1))
    for n in range(3):
        q.schedule({"n": n}, id=f"x{n}")
    inflight, retrying, dead = q.claim(3)
    q.nack(retrying, delay=0.5, reason="boom")
    q.bury(dead, "poison")
    q.schedule({"n": "aborted"}, id="aborted")
    (aborted,) = q.claim(1)
    assert q.abort(aborted.id, "by staff")  # in flight, aborted: ends in the dead letters
    q.schedule({"n": "ready"}, id="ready")
    for n in range(3):
        q.schedule({"n": n}, id=f"r{n}")
    q.cancel("r1")  # a dead entry in the middle of ready
    q.schedule({"n": "back"}, delay=10, id="back")
    q.run_now("back")  # ready, with the time it came back
    assert q.schedule({"n": "next"}, id=inflight.id, replace=True, key="k1").successor
    q.schedule({"n": "later"}, delay=10, id="later", key="k1")
    q.schedule({"n": "soon"}, delay=1, id="soon")
    # Tasks with a priority: one ready in the ranked zset, one waiting to be promoted there.
    _task(q, "urgent", priority=9)
    _task(q, "unhurried", priority=-4, delay=1)
    q.send_once(q.prepare({"n": "outbox"}, id="outbox"), "row-0")  # a token remembered
    # The retrying one as if a consumer of an older envelope format had left it (defer.lua).
    # And one such message since delivered: an entry the count forgets (newer_waiting.lua).
    client.hset(q.keys.newer, mapping={retrying.id: "2 1", "delivered": "2 4"})
    clock.advance(2)  # "soon", the retry and the in-flight deadline are all due now
    held = Held(q, clock, inflight, retrying.id, "later")
    _journal(held)  # an entry for the stats to tally
    _advance(held, Recurrence("beat", "typed", every=3600))  # a schedule with a waiting tick
    return held


def _task(q: Queue, message_id: str, priority: int, delay: float | None = None) -> None:
    prepared = q.prepare({"n": message_id}, delay=delay, id=message_id)
    q.send_with_record(prepared, q.keys.task_result(message_id), "{}", priority=priority)


def _limited(q: Queue) -> Queue:
    q.settings = q.settings.replace(rate_limit="5/s burst 2", max_in_flight=10)
    return q


def _stats(h: Held) -> None:
    # The script alone: gather() batches it with counts.lua and reports errors, not raises.
    h.queue.activity_call(0, 100, 10).run(h.queue.client)


def _journal(h: Held) -> None:
    now = h.clock.now_ms()
    fields = journal_entry([Outcome(h.inflight, ACK, now, now)])
    call = JOURNAL.call(h.queue.keys, max_length=100, fields=sum(fields.items(), ()))
    call.run(h.queue.client)


OPERATIONS: dict[str, Callable[[Held], object]] = {
    "schedule due now": lambda h: h.queue.schedule({"n": "new"}),
    "schedule later": lambda h: h.queue.schedule({"n": "new"}, delay=5),
    "replace waiting": lambda h: h.queue.schedule({"n": "new"}, id=h.pending, replace=True),
    "replace ready": lambda h: h.queue.schedule({"n": "new"}, delay=5, id="r2", replace=True),
    "replace in flight": lambda h: h.queue.schedule({"n": 2}, id=h.inflight.id, replace=True),
    "replace dead": lambda h: h.queue.schedule({"n": "new"}, id="x2", replace=True),
    "enqueue a task due now": lambda h: _task(h.queue, "new", priority=3),
    "enqueue a task later": lambda h: _task(h.queue, "new", priority=-3, delay=5),
    "send once": lambda h: h.queue.send_once(h.queue.prepare({"n": 1}, id="o1"), "row-1"),
    "send once, replacing": lambda h: h.queue.send_once(
        h.queue.prepare({"n": 1}, id=h.pending), "row-1", replace=True
    ),
    "send once, a task": lambda h: h.queue.send_once(
        h.queue.prepare({"n": 1}, id="t1"),
        "row-1",
        record_key=h.queue.keys.task_result("t1"),
        record="{}",
        priority=4,
    ),
    "schedule with a window": lambda h: h.queue.schedule({"n": 1}, id="w1", unique_for=60),
    "replace with a window": lambda h: h.queue.schedule(
        {"n": 1}, id=h.pending, replace=True, unique_for=60
    ),
    "send once with a window": lambda h: h.queue.send_once(
        h.queue.prepare({"n": 1}, id="w1"), "row-1", unique_ms=60_000
    ),
    "schedule_many with windows": lambda h: h.queue.schedule_many(
        [
            {"payload": 1, "id": "w1", "unique_for": 1},
            {"payload": 2, "id": "w2", "delay": 5},
            {"payload": 3, "id": "w3", "delay": 5, "unique_for": 1},
        ]
    ),
    "schedule_many": lambda h: h.queue.schedule_many(
        [{"payload": 1}, {"payload": 2, "delay": 5}, {"payload": 3, "delay": 0}]
    ),
    "promote": lambda h: h.queue.promote(),
    "claim": lambda h: h.queue.claim(10),
    "claim under flow limits": lambda h: _limited(h.queue).claim(10),
    "ack": lambda h: h.queue.ack(h.inflight),
    "nack": lambda h: h.queue.nack(h.inflight, delay=1, reason="again"),
    "bury": lambda h: h.queue.bury(h.inflight, "poison"),
    "reap": lambda h: h.queue.reap(),
    "extend": lambda h: h.queue.extend(h.inflight),
    "abort": lambda h: h.queue.abort(h.inflight.id, "stop"),
    "release": lambda h: h.queue.release(h.inflight),
    "leave for a newer consumer": lambda h: h.queue.leave_for_newer([(h.inflight, 2)], 1),
    "count those waiting for a newer consumer": lambda h: NEWER_WAITING.call(
        h.queue.keys, most_entries=10
    ).run(h.queue.client),
    "cancel": lambda h: h.queue.cancel(h.pending, "ready", h.retrying, "urgent"),
    "run_now": lambda h: h.queue.run_now(h.pending, h.retrying),
    "requeue": lambda h: h.queue.requeue(),
    "purge": lambda h: h.queue.purge(),
    "counts": lambda h: h.queue.counts(),
    "peek": lambda h: h.queue.peek("ready"),
    "journal": _journal,
    "stats": _stats,
    "advance a schedule": lambda h: _advance(h, Recurrence("beat", "typed", every=1)),
    "edit a schedule": lambda h: _advance(h, Recurrence("beat", "typed", every=7)),
    "delete a schedule": lambda h: _advance(h, None),
    "record a tick's run": lambda h: record_tick_call(
        h.queue, "beat", tick_run(h.clock.now_ms(), h.clock.now_ms(), "ack", "")
    ).run(h.queue.client),
    "read recurrence states": lambda h: RECURRENCE_STATES.call(h.queue.keys).run(h.queue.client),
}


def _advance(h: Held, recurrence: Recurrence | None) -> None:
    """What a consumer's keeper sends: a schedule created, then (again) changed or deleted."""
    keeper = ScheduleKeeper()
    keeper.set_definitions([] if recurrence is None else [recurrence], [h.queue])
    keeper_rounds(keeper, [h.queue], h.queue.client, h.clock.now_ms())


KEY_NAMES = [
    "pending", "ready", "unack", "retry", "garbage", "messages", "attempts", "tokens",
    "reasons", "seq", "journal", "tally", "config", "heartbeats", "consumer_details", "cancelled",
    "ready_since", "successors", "exported", "priorities", "ranked", "sent", "replicated",
    "recurrence_states", "ticks", "tick_runs", "aborts", "limiter", "unique", "flow_keys",
    "timings",
    "key_turns", "key_waiting", "key_state", "key_tats", "key_load",
    "progress", "newer",
]  # fmt: skip


BAD_VALUES = ["seq not an integer", "attempts not a number"]


def dump_all(client: redis.Redis, keys: list[str]) -> dict[str, bytes | None]:
    return {key: client.dump(key) for key in keys}


def damage(held: Held, how: str) -> None:
    """Break one key's type (``how`` is a key name) or put a bad value in a key."""
    client, keys = held.queue.client, held.queue.keys
    if how == "seq not an integer":
        client.set(keys.seq, "12x")
    elif how == "attempts not a number":
        # The in-flight, retrying, dead and a ready message: every path that reads a count.
        for message_id in (held.inflight.id, held.retrying, "x2", "ready"):
            client.hset(keys.attempts, message_id, "lots")
    else:
        break_key(client, getattr(keys, how))


def _members(client: redis.Redis, key: str, kind: bytes) -> list[str] | None:
    """The members of a zset or list key, or None when the key holds another type."""
    actual = client.type(key)
    if actual == b"none":
        return []
    if actual != kind:
        return None
    raw = client.zrange(key, 0, -1) if kind == b"zset" else client.lrange(key, 0, -1)
    return [i.decode() for i in raw]


def _live(client: redis.Redis, keys: QueueKeys, ready: list[str]) -> list[str]:
    """The ready entries less the dead ones cancel left (an id's first n entries are dead)."""
    if client.type(keys.cancelled) not in (b"hash", b"none"):
        return ready
    dead = {i.decode(): int(n) for i, n in client.hgetall(keys.cancelled).items()}
    live = []
    for message_id in ready:
        if dead.get(message_id, 0) > 0:
            dead[message_id] -= 1
        else:
            live.append(message_id)
    return live


def misplaced(held: Held) -> set[str]:
    """Ids that are not in exactly one state with an envelope (lost or doubled messages).

    A key of the wrong type is not read: the ids it held are misplaced already (the test broke
    them), and an operation must only not add to them.
    """
    client, keys = held.queue.client, held.queue.keys
    where: dict[str, list[str]] = {}
    for state in ("pending", "unack", "retry", "garbage", "ready", "ranked"):
        members = _members(client, getattr(keys, state), b"list" if state == "ready" else b"zset")
        if state == "ready" and members:
            members = _live(client, keys, members)
        for message_id in members or []:
            where.setdefault(message_id, []).append(state)
    for key_list in client.scan_iter(match=keys.key_lists + "*"):  # keyed ready messages
        for message_id in _members(client, key_list.decode(), b"list") or []:
            where.setdefault(message_id, []).append("ready")
    envelopes = (
        {i.decode() for i in client.hkeys(keys.messages)}
        if client.type(keys.messages) in (b"hash", b"none")
        else set(where)  # unreadable: judge by the states alone
    )
    return {
        message_id
        for message_id in set(where) | envelopes
        if len(where.get(message_id, [])) != 1 or message_id not in envelopes
    }


def break_key(client: redis.Redis, key: str) -> None:
    """Give ``key`` a value of another type than it should hold."""
    is_string = client.type(key) == b"string" or key.endswith(":seq")
    client.delete(key)
    if is_string:
        client.rpush(key, "oops")
    else:
        client.set(key, "oops")


def test_every_key_of_a_queue_is_broken_by_this_test() -> None:
    keys = Queue(redis.Redis(), "typed").keys
    assert {getattr(keys, name) for name in KEY_NAMES} == set(keys.all_keys())


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("how", KEY_NAMES + BAD_VALUES)
def test_a_broken_key_fails_an_operation_before_it_changes_anything_or_loses_nothing(
    redis_client: redis.Redis, operation: str, how: str
) -> None:
    """Either the operation fails having changed nothing, or it leaves no message misplaced."""
    held = populated(redis_client)
    all_keys = held.queue.keys.all_keys()
    damage(held, how)
    before, misplaced_before = dump_all(redis_client, all_keys), misplaced(held)
    try:
        OPERATIONS[operation](held)
    except ScriptFailed as e:
        if how in KEY_NAMES:
            assert "WRONGTYPE" in str(e)
        assert dump_all(redis_client, all_keys) == before, f"{operation} failed half-way"
    else:
        added = misplaced(held) - misplaced_before
        assert not added, f"{operation} succeeded but lost or doubled {sorted(added)}"


def test_a_non_integer_token_counter_fails_a_claim_before_it_pops_anything(
    redis_client: redis.Redis,
) -> None:
    held = populated(redis_client)
    damage(held, "seq not an integer")
    k = held.queue.keys
    before = dump_all(redis_client, k.all_keys())
    with pytest.raises(ScriptFailed, match="not an integer"):
        held.queue.claim(10)
    assert dump_all(redis_client, k.all_keys()) == before


def _dead_with_reason(held: Held, message_id: str) -> str:
    client, k = held.queue.client, held.queue.keys
    assert client.zscore(k.garbage, message_id) is not None, f"{message_id} is not dead"
    for state in (k.pending, k.unack, k.retry):
        assert client.zscore(state, message_id) is None
    assert message_id.encode() not in client.lrange(k.ready, 0, -1)
    assert client.hexists(k.messages, message_id)  # dead, not lost: requeueable
    return client.hget(k.reasons, message_id).decode()


@pytest.mark.parametrize("operation", ["nack", "bury", "reap"])
def test_an_unreadable_attempt_count_sends_a_delivery_to_garbage_with_a_reason(
    redis_client: redis.Redis, operation: str
) -> None:
    held = populated(redis_client)
    damage(held, "attempts not a number")
    # Without its successor, which would take the dead delivery's place (test_core_replace).
    redis_client.delete(held.queue.keys.successors)
    if operation == "reap":
        held.clock.advance(60)  # every deadline has passed
    results = OPERATIONS[operation](held)
    assert "'lots'" in _dead_with_reason(held, held.inflight.id)
    if operation != "reap":
        assert results in (2, True)  # the delivery's fate, as for a burial
    held.queue.requeue(held.inflight.id)  # the way out: a fresh count
    (again,) = [m for m in held.queue.claim(10) if m.id == held.inflight.id]
    assert again.attempt == 1


def test_an_unreadable_attempt_count_sends_a_ready_message_to_garbage_at_claim(
    redis_client: redis.Redis,
) -> None:
    held = populated(redis_client)
    damage(held, "attempts not a number")
    claimed = held.queue.claim(10)
    assert "ready" not in [m.id for m in claimed]
    assert "'lots'" in _dead_with_reason(held, "ready")
    assert not misplaced(held)


def test_the_operations_write_when_nothing_is_broken(redis_client: redis.Redis) -> None:
    """The check above would pass vacuously if the operations did nothing: they do."""
    for operation in sorted(OPERATIONS):
        held = populated(redis_client)
        all_keys = held.queue.keys.all_keys()
        before = dump_all(redis_client, all_keys)
        OPERATIONS[operation](held)
        if operation not in ("counts", "peek", "read recurrence states"):  # reads
            assert dump_all(redis_client, all_keys) != before, f"{operation} changed nothing"
        redis_client.delete(*all_keys)
