"""A Hypothesis state machine drives the real Lua scripts against a small reference model.

Every rule calls the real :class:`Queue` (so the real ``.lua`` files run on the session's
redis-server) and applies the same transition to a plain-Python model of the five states.
After every step the invariants read the queue's keys directly: every message is in exactly
one state, Redis and the model agree on the members (and the order of the ready list), and the
messages hash holds exactly the ids that are in some state. The ready list is read without the
dead entries a cancel leaves in it. Tasks with a priority wait in ready in the ranked zset, and
claims, counts and peek take them in priority order around the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_delayqueue.core import ManualClock, Message, Queue, QueueSettings
from django_delayqueue.core.envelope import decode_envelope
from django_delayqueue.core.keys import TOMBSTONE_TOTAL

IDS = st.sampled_from([f"m{i}" for i in range(6)])
PRIORITIES = st.sampled_from([-7, -1, 0, 2, 9])
RANK_BAND = 2**43  # ready_list.lua's
RANK_ORDER = " order"  # the field counting entries into the ranked zset
MAX_ATTEMPTS = 3
VISIBILITY_MS = 1000


@dataclass
class Model:
    """The states as the design describes them; zsets as id -> score."""

    pending: dict[str, int] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    unack: dict[str, int] = field(default_factory=dict)
    retry: dict[str, int] = field(default_factory=dict)
    garbage: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    successors: dict[str, int] = field(default_factory=dict)  # id -> due of its successor
    priorities: dict[str, int] = field(default_factory=dict)  # the non-zero ones
    ranked: dict[str, int] = field(default_factory=dict)  # ready with a priority: id -> score
    rank_order: int = 0  # entries into the ranked zset so far
    seq: int = 0

    def state_of(self, message_id: str) -> str | None:
        for name in ("pending", "unack", "retry", "garbage"):
            if message_id in getattr(self, name):
                return name
        return "ready" if message_id in self.ready or message_id in self.ranked else None

    def ready_order(self) -> list[str]:
        """Ready as a claim takes it: priorities above 0, the list, then those below 0."""
        ranked = _zorder(self.ranked)
        high = [i for i in ranked if self.ranked[i] < 100 * RANK_BAND]
        return high + self.ready + [i for i in ranked if self.ranked[i] > 100 * RANK_BAND]

    def to_ready(self, message_id: str, now: int, front: bool = False) -> None:
        priority = self.priorities.get(message_id, 0)
        if priority:
            self.rank_order += 1
            offset = -self.rank_order if front else self.rank_order
            self.ranked[message_id] = (100 - priority) * RANK_BAND + RANK_BAND // 2 + offset
        elif front:
            self.ready.insert(0, message_id)
        else:
            self.ready.append(message_id)

    def take_ready(self, message_id: str) -> None:
        if self.ranked.pop(message_id, None) is None:
            self.ready.remove(message_id)

    def forget(self, message_id: str) -> None:
        for zset in (self.pending, self.unack, self.retry, self.garbage):
            zset.pop(message_id, None)
        if message_id in self.ready:
            self.ready.remove(message_id)
        self.ranked.pop(message_id, None)
        self.priorities.pop(message_id, None)
        self.attempts.pop(message_id, None)
        self.tokens.pop(message_id, None)

    def place(self, message_id: str, due: int, now: int) -> None:
        if due <= now:
            self.ready.append(message_id)
        else:
            self.pending[message_id] = due

    def succeed(self, message_id: str, now: int) -> None:
        """The finished or dead message is gone: its successor, if any, takes its place."""
        self.forget(message_id)
        if message_id in self.successors:
            self.place(message_id, self.successors.pop(message_id), now)


def _zorder(zset: dict[str, int]) -> list[str]:
    """Redis zset order: by score, then by member bytes."""
    return [k for k, _ in sorted(zset.items(), key=lambda kv: (kv[1], kv[0].encode()))]


def live_ready(client: redis.Redis, ready: str, cancelled: str) -> list[str]:
    """The ready list without the dead entries cancel leaves (an id's first n entries)."""
    dead = {i.decode(): int(n) for i, n in client.hgetall(cancelled).items()}
    assert dead.pop(TOMBSTONE_TOTAL, 0) == sum(dead.values()), "dead entry total is off"
    live = []
    for message_id in (i.decode() for i in client.lrange(ready, 0, -1)):
        if dead.get(message_id, 0) > 0:
            dead[message_id] -= 1
        else:
            live.append(message_id)
    assert not any(dead.values()), f"dead entries counted but not in the list: {dead}"
    return live


class QueueMachine(RuleBasedStateMachine):
    client: redis.Redis  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.queue = Queue(
            self.client,
            "prop",
            prefix="hyp",
            clock=self.clock,
            settings=QueueSettings(
                max_attempts=MAX_ATTEMPTS, visibility_timeout=VISIBILITY_MS / 1000
            ),
        )
        self.client.delete(*self.queue.keys.all_keys())
        self.model = Model()
        self.deliveries: list[Message] = []  # every claimed delivery, stale ones included
        self.fresh_ids = 0

    # --- rules -------------------------------------------------------------------------------

    @rule(message_id=st.one_of(st.none(), IDS), delay_ms=st.integers(0, 3000))
    def schedule(self, message_id: str | None, delay_ms: int) -> None:
        now = self.clock.now_ms()
        if message_id is None:
            # A fresh id, but not a random one: ids order members of equal score in a zset, so
            # random ids made Hypothesis' replays draw from differently ordered deliveries.
            self.fresh_ids += 1
            message_id = f"fresh{self.fresh_ids}"
        result = self.queue.schedule({"n": 1}, delay=delay_ms / 1000, id=message_id)
        m = self.model
        assert result.state == m.state_of(result.id)
        assert result.created is (result.state is None)
        if result.created:
            m.place(result.id, result.due_ms, now)

    @rule(message_id=st.one_of(st.none(), IDS), delay_ms=st.integers(0, 3000), priority=PRIORITIES)
    def enqueue_task(self, message_id: str | None, delay_ms: int, priority: int) -> None:
        now = self.clock.now_ms()
        if message_id is None:
            self.fresh_ids += 1
            message_id = f"task{self.fresh_ids}"
        q, m = self.queue, self.model
        prepared = q.prepare({"n": 3}, delay=delay_ms / 1000, id=message_id, now_ms=now)
        record = q.keys.task_result(message_id)
        result = q.send_with_record(prepared, record, "{}", priority=priority, now_ms=now)
        assert result.state == m.state_of(message_id)
        if result.created:
            if priority:
                m.priorities[message_id] = priority
            if result.due_ms <= now:
                m.to_ready(message_id, now)
            else:
                m.pending[message_id] = result.due_ms

    @rule(message_id=IDS, delay_ms=st.integers(0, 3000))
    def replace(self, message_id: str, delay_ms: int) -> None:
        now = self.clock.now_ms()
        result = self.queue.schedule({"n": 2}, delay=delay_ms / 1000, id=message_id, replace=True)
        m = self.model
        state = m.state_of(message_id)
        assert (result.created, result.state) == (True, state)
        if state == "unack":
            m.successors[message_id] = result.due_ms
            event("replace: successor")
            return
        m.successors.pop(message_id, None)
        if state == "ready" and result.due_ms <= now:
            m.attempts.pop(message_id, None)  # a new message in the same place
            m.tokens.pop(message_id, None)
            m.priorities.pop(message_id, None)
            if m.ranked.pop(message_id, None) is not None:  # without its priority: the list
                m.ready.append(message_id)
            return
        m.forget(message_id)
        m.place(message_id, result.due_ms, now)

    @rule(ms=st.integers(0, 2500))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms=ms)

    @rule(limit=st.integers(1, 4))
    def promote(self, limit: int) -> None:
        now = self.clock.now_ms()
        result = self.queue.promote(now_ms=now, limit=limit)
        m = self.model
        moved = 0
        for zset, clears_token in ((m.pending, False), (m.retry, True)):
            due = [i for i in _zorder(zset) if zset[i] <= now][:limit]
            for message_id in due:
                del zset[message_id]
                m.to_ready(message_id, now)
                if clears_token:
                    m.tokens.pop(message_id, None)
            moved += len(due)
        assert result.moved == moved

    @rule(count=st.integers(1, 3))
    def claim(self, count: int) -> None:
        now = self.clock.now_ms()
        claimed = self.queue.claim(count, now_ms=now)
        m = self.model
        expected = m.ready_order()[:count]
        for message_id in expected:
            m.take_ready(message_id)
        assert [c.id for c in claimed] == expected
        for message in claimed:
            m.seq += 1
            m.attempts[message.id] = m.attempts.get(message.id, 0) + 1
            m.tokens[message.id] = str(m.seq)
            m.unack[message.id] = now + VISIBILITY_MS
            assert message.token == str(m.seq)
            assert message.attempt == m.attempts[message.id]
        self.deliveries.extend(claimed)

    @precondition(lambda self: self.deliveries)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        delivery = data.draw(st.sampled_from(self.deliveries))
        current = self.model.tokens.get(delivery.id) == delivery.token
        now = self.clock.now_ms()
        assert self.queue.ack(delivery) == int(current)
        if current:
            self.model.succeed(delivery.id, now)

    @precondition(lambda self: self.deliveries)
    # Multiples of 1/8 s: exact as float seconds, so no rounding choice of nack_call's
    # seconds -> ms conversion (down, here, 1.005 s -> 1004 ms) can split model and queue.
    @rule(data=st.data(), bury=st.booleans(), delay_ms=st.integers(0, 16).map(lambda n: n * 125))
    def nack(self, data: st.DataObject, bury: bool, delay_ms: int) -> None:
        delivery = data.draw(st.sampled_from(self.deliveries))
        now = self.clock.now_ms()
        m = self.model
        if bury:
            code = self.queue.nack_many([(delivery, None, "buried")], bury=True)[0]
        else:
            code = self.queue.nack(delivery, delay=delay_ms / 1000, reason="failed")
        expected = 0
        if m.tokens.get(delivery.id) == delivery.token and delivery.id in m.unack:
            del m.unack[delivery.id]
            if bury or m.attempts.get(delivery.id, 0) >= MAX_ATTEMPTS:
                expected = 2
                if delivery.id in m.successors:
                    m.succeed(delivery.id, now)
                    event("nack: successor takes a dead delivery's place")
                else:
                    m.garbage[delivery.id] = now
                    event("nack: to garbage")
            else:
                m.retry[delivery.id] = now + delay_ms
                expected = 1
        assert code == expected

    @precondition(lambda self: self.deliveries)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        delivery = data.draw(st.sampled_from(self.deliveries))
        m = self.model
        expected = int(m.tokens.get(delivery.id) == delivery.token and delivery.id in m.unack)
        assert self.queue.release(delivery) == expected
        if expected:
            del m.unack[delivery.id]
            m.to_ready(delivery.id, self.clock.now_ms(), front=True)
            m.attempts[delivery.id] -= 1
            if m.attempts[delivery.id] <= 0:
                del m.attempts[delivery.id]
            del m.tokens[delivery.id]

    @rule()
    def reap(self) -> None:
        now = self.clock.now_ms()
        result = self.queue.reap(now_ms=now)
        m = self.model
        retried = buried = 0
        for message_id in [i for i in _zorder(m.unack) if m.unack[i] <= now]:
            del m.unack[message_id]
            attempts = m.attempts.get(message_id, 0)
            if attempts >= MAX_ATTEMPTS:
                if message_id in m.successors:
                    m.succeed(message_id, now)
                else:
                    m.garbage[message_id] = now
                buried += 1
                event("reap: last attempt to garbage")
            else:
                # reap.lua's backoff: base (1 s default) doubled per attempt, no jitter.
                m.retry[message_id] = now + min(3_600_000, 1000 * 2 ** max(0, attempts - 1))
                retried += 1
        assert (result.retried, result.buried) == (retried, buried)

    @rule()
    def time_out_and_redeliver(self) -> None:
        """A shortcut through reap -> retry -> ready -> unack, so last attempts happen often."""
        self.advance(5000)
        self.reap()
        self.promote(limit=6)
        self.claim(count=3)

    @rule(message_id=IDS)
    def cancel(self, message_id: str) -> None:
        m = self.model
        waiting = m.state_of(message_id) in ("pending", "retry", "ready")
        successor = m.successors.pop(message_id, None) is not None
        assert self.queue.cancel(message_id) == int(waiting) + int(successor)
        if waiting:
            m.forget(message_id)

    @rule(message_id=IDS)
    def run_now(self, message_id: str) -> None:
        m = self.model
        source = m.state_of(message_id)
        moved = source in ("pending", "retry")
        assert self.queue.run_now(message_id) == int(moved)
        if moved:
            getattr(m, source).pop(message_id)
            m.to_ready(message_id, self.clock.now_ms())
            m.tokens.pop(message_id, None)

    @rule(message_id=st.one_of(st.none(), IDS))
    def requeue(self, message_id: str | None) -> None:
        m = self.model
        ids = [message_id] if message_id is not None else _zorder(m.garbage)
        ids = [i for i in ids if i in m.garbage]
        got = self.queue.requeue(message_id) if message_id else self.queue.requeue()
        assert got == len(ids)
        for i in ids:
            del m.garbage[i]
            m.to_ready(i, self.clock.now_ms())
            m.attempts.pop(i, None)
            m.tokens.pop(i, None)

    @rule(message_id=st.one_of(st.none(), IDS))
    def purge(self, message_id: str | None) -> None:
        m = self.model
        ids = [message_id] if message_id is not None else list(m.garbage)
        ids = [i for i in ids if i in m.garbage]
        got = self.queue.purge(message_id) if message_id else self.queue.purge()
        assert got == len(ids)
        for i in ids:
            m.forget(i)

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def every_message_in_exactly_one_state(self) -> None:
        k, c, m = self.queue.keys, self.client, self.model
        zsets = {
            name: {i.decode(): int(s) for i, s in c.zrange(key, 0, -1, withscores=True)}
            for name, key in (
                ("pending", k.pending),
                ("unack", k.unack),
                ("retry", k.retry),
                ("garbage", k.garbage),
            )
        }
        ready = live_ready(c, k.ready, k.cancelled)
        seen: dict[str, list[str]] = {}
        for name, members in zsets.items():
            for i in members:
                seen.setdefault(i, []).append(name)
        ranked = {i.decode(): int(s) for i, s in c.zrange(k.ranked, 0, -1, withscores=True)}
        for i in [*ready, *ranked]:
            seen.setdefault(i, []).append("ready")
        multiple = {i: states for i, states in seen.items() if len(states) != 1}
        assert not multiple, f"ids in more than one state: {multiple}"

        assert ready == m.ready
        assert ranked == m.ranked
        assert self.queue.counts() == {
            "pending": len(m.pending),
            "ready": len(m.ready) + len(m.ranked),
            "unack": len(m.unack),
            "retry": len(m.retry),
            "garbage": len(m.garbage),
        }
        order = m.ready_order()
        assert [p.id for p in self.queue.peek("ready").messages] == order
        pages = [self.queue.peek("ready", offset, 2).messages for offset in range(0, len(order), 2)]
        assert [p.id for page in pages for p in page] == order, "pages of peek cross the bands"
        priorities = {i.decode(): int(v) for i, v in c.hgetall(k.priorities).items()}
        assert priorities.pop(RANK_ORDER, 0) == m.rank_order
        assert priorities == m.priorities
        for name, members in zsets.items():
            assert members == getattr(m, name), name
        stored = {i.decode() for i in c.hkeys(k.messages)}
        assert stored == set(seen), "messages hash must hold exactly the ids in some state"
        attempts = {i.decode(): int(v) for i, v in c.hgetall(k.attempts).items()}
        assert attempts == {i: n for i, n in m.attempts.items() if n}
        successors = {i.decode(): decode_envelope(v)[0] for i, v in c.hgetall(k.successors).items()}
        assert successors == m.successors


@pytest.mark.slow
def test_lua_scripts_match_the_reference_model(redis_client: redis.Redis) -> None:
    QueueMachine.client = redis_client
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=200,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
