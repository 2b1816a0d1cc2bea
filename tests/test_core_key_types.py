"""A key of the wrong type never leaves a transition half-done.

Redis does not roll a script back when a command inside it fails, so a script that wrote to one
key and then hit a wrong-type key would leave a message half-moved (popped from ready but never
marked in flight: lost). The scripts check the types of the keys they are about to write before
their first write. This test breaks every key of a queue in turn, runs every operation against
a queue holding messages in every state, and requires that an operation either succeeds or
fails having changed nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

from django_delayqueue.core import ManualClock, Message, Queue, QueueSettings, ScriptFailed
from django_delayqueue.core.outcome import ACK, Outcome, journal_entry
from django_delayqueue.core.scripts import LuaScript


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
    q.schedule({"n": "ready"}, id="ready")
    q.schedule({"n": "later"}, delay=10, id="later")
    q.schedule({"n": "soon"}, delay=1, id="soon")
    clock.advance(2)  # "soon", the retry and the in-flight deadline are all due now
    held = Held(q, clock, inflight, retrying.id, "later")
    _journal(held)  # an entry for the stats to tally
    return held


def _stats(h: Held) -> None:
    # The script alone: gather() batches it with counts.lua and reports errors, not raises.
    k = h.queue.keys
    LuaScript.named("stats")(
        h.queue.client, [k.journal, k.tally, k.heartbeats, k.config], [100, 0, 10]
    )


def _journal(h: Held) -> None:
    k = h.queue.keys
    now = h.clock.now_ms()
    fields = journal_entry([Outcome(h.inflight, ACK, now, now)])
    LuaScript.named("journal")(h.queue.client, [k.journal], [100, *sum(fields.items(), ())])


OPERATIONS: dict[str, Callable[[Held], object]] = {
    "schedule due now": lambda h: h.queue.schedule({"n": "new"}),
    "schedule later": lambda h: h.queue.schedule({"n": "new"}, delay=5),
    "schedule_many": lambda h: h.queue.schedule_many(
        [{"payload": 1}, {"payload": 2, "delay": 5}, {"payload": 3, "delay": 0}]
    ),
    "promote": lambda h: h.queue.promote(),
    "claim": lambda h: h.queue.claim(10),
    "ack": lambda h: h.queue.ack(h.inflight),
    "nack": lambda h: h.queue.nack(h.inflight, delay=1, reason="again"),
    "bury": lambda h: h.queue.bury(h.inflight, "poison"),
    "reap": lambda h: h.queue.reap(),
    "extend": lambda h: h.queue.extend(h.inflight),
    "release": lambda h: h.queue.release(h.inflight),
    "cancel": lambda h: h.queue.cancel(h.pending, "ready", h.retrying),
    "run_now": lambda h: h.queue.run_now(h.pending, h.retrying),
    "requeue": lambda h: h.queue.requeue(),
    "purge": lambda h: h.queue.purge(),
    "counts": lambda h: h.queue.counts(),
    "peek": lambda h: h.queue.peek("ready"),
    "journal": _journal,
    "stats": _stats,
}

KEY_NAMES = [
    "pending", "ready", "unack", "retry", "garbage", "messages", "attempts", "tokens",
    "reasons", "seq", "journal", "tally", "config", "heartbeats",
]  # fmt: skip


def dump_all(client: redis.Redis, keys: list[str]) -> dict[str, bytes | None]:
    return {key: client.dump(key) for key in keys}


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
@pytest.mark.parametrize("key_name", KEY_NAMES)
def test_a_wrong_type_key_fails_an_operation_before_it_changes_anything(
    redis_client: redis.Redis, operation: str, key_name: str
) -> None:
    held = populated(redis_client)
    all_keys = held.queue.keys.all_keys()
    break_key(redis_client, getattr(held.queue.keys, key_name))
    before = dump_all(redis_client, all_keys)
    try:
        OPERATIONS[operation](held)
    except ScriptFailed as e:
        assert "WRONGTYPE" in str(e)
        assert dump_all(redis_client, all_keys) == before, f"{operation} failed half-way"


def test_the_operations_write_when_nothing_is_broken(redis_client: redis.Redis) -> None:
    """The check above would pass vacuously if the operations did nothing: they do."""
    for operation in sorted(OPERATIONS):
        held = populated(redis_client)
        all_keys = held.queue.keys.all_keys()
        before = dump_all(redis_client, all_keys)
        OPERATIONS[operation](held)
        if operation not in ("counts", "peek"):
            assert dump_all(redis_client, all_keys) != before, f"{operation} changed nothing"
        redis_client.delete(*all_keys)
