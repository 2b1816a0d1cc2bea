"""The one stats function: counts, overdue age, consumers, published pause, journal totals."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.errors import Reject
from django_delayqueue.embedded import free_port
from django_delayqueue.monitoring import stats

T0 = 1_700_000_000_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def make_queue(client: Any, name: str, clock: ManualClock, **settings: Any) -> Queue:
    return Queue(client, name, prefix="dq", clock=clock, settings=QueueSettings(**settings))


def journal(q: Queue, *outcomes: str) -> None:
    """Append one journal entry (one consumer batch) with a row per outcome."""
    rows = [[f"m{i}", T0, T0, T0, T0, 1, o, ""] for i, o in enumerate(outcomes)]
    q.client.xadd(q.keys.journal, {"n": str(len(rows)), "o": json.dumps(rows)})


def test_counts_overdue_and_next_due(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    q.schedule({"n": 1}, delay=10)
    q.schedule({"n": 2}, delay=20)
    q.schedule({"n": 3}, delay=100)
    clock.advance(15)  # the first is 5 s overdue (nobody promoted it)
    (s,) = stats.gather([q])
    assert s.ok and s.errors == []
    assert s.counts == {"pending": 3, "ready": 0, "unack": 0, "retry": 0, "garbage": 0}
    assert s.oldest_overdue_ms == 5000
    assert s.oldest_overdue_seconds == 5.0
    assert s.next_due_ms == T0 + 10_000
    assert s.paused is False
    assert s.consumers_alive == 0 and s.consumers == []
    assert (s.deliveries, s.failures) == (0, 0)


def test_every_state_is_counted(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock, max_attempts=3)
    for i in range(5):
        q.schedule({"i": i}, id=f"m{i}")
    q.schedule({"later": True}, delay=60)
    a, b, _in_flight = q.claim(3)
    q.nack(a, delay=30, reason="boom")
    q.bury(b, "poison")
    (s,) = stats.gather([q])
    assert s.counts == {"pending": 1, "ready": 2, "unack": 1, "retry": 1, "garbage": 1}
    # The ready head has been due since T0: the queue is late by exactly that long.
    clock.advance(2)
    (s,) = stats.gather([q])
    assert s.oldest_overdue_ms == 2000
    assert s.to_dict()["counts"]["garbage"] == 1


def test_consumers_alive_from_heartbeats(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    redis_client.zadd(q.keys.heartbeats, {"fresh": T0 - 1000, "stale": T0 - 120_000})
    (s,) = stats.gather([q], alive_seconds=30)
    assert s.consumers_alive == 1
    assert s.consumers == [("fresh", T0 - 1000), ("stale", T0 - 120_000)]
    (s,) = stats.gather([q], alive_seconds=300)
    assert s.consumers_alive == 2
    data = s.to_dict()["consumers"]
    assert data[0] == {"name": "fresh", "last_seen_seconds_ago": 1.0}


def test_a_real_consumer_heartbeats_and_its_outcomes_are_tallied(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock, max_attempts=1)
    for i in range(4):
        q.schedule({"i": i})

    seen_while_running: list[stats.QueueStats] = []

    def handler(message):
        if message.payload["i"] == 0:
            seen_while_running.extend(stats.gather([q]))
        if message.payload["i"] == 1:
            raise RuntimeError("boom")  # max_attempts=1: straight to garbage
        if message.payload["i"] == 2:
            raise Reject("bad order")

    consumer = Consumer([q], handler, burst=True, name="worker-1")
    assert consumer.run() == 0
    (running,) = seen_while_running
    assert running.consumers_alive == 1 and running.consumers[0][0] == "worker-1"
    (s,) = stats.gather([q])
    assert s.consumers_alive == 0 and s.consumers == []  # it said goodbye as it stopped
    # The failure on the last (only) attempt went to the dead letters: garbage, not retry.
    assert s.outcomes == {"ack": 2, "retry": 0, "garbage": 2}
    assert (s.deliveries, s.failures) == (4, 2)
    assert s.counts["garbage"] == 2


def test_tally_counts_each_entry_once_and_catches_up_in_batches(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    for _ in range(5):
        journal(q, "ack", "retry")
    (s,) = stats.gather([q], journal_batch=2)
    assert s.outcomes == {"ack": 2, "retry": 2, "garbage": 0}
    (s,) = stats.gather([q], journal_batch=2)
    assert s.outcomes == {"ack": 4, "retry": 4, "garbage": 0}
    (s,) = stats.gather([q], journal_batch=2)
    assert (s.deliveries, s.failures) == (10, 5)
    # Nothing new: totals hold still however often they are read.
    for _ in range(3):
        (s,) = stats.gather([q])
    assert (s.deliveries, s.failures) == (10, 5)
    journal(q, "garbage")
    (s,) = stats.gather([q])
    assert s.outcomes == {"ack": 5, "retry": 5, "garbage": 1}


def test_tally_survives_a_corrupt_journal_entry(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    redis_client.xadd(q.keys.journal, {"n": "1", "o": "not json"})
    journal(q, "ack")
    (s,) = stats.gather([q])
    assert s.ok and s.outcomes == {"ack": 1, "retry": 0, "garbage": 0}


def test_paused_comes_from_the_published_settings(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    (s,) = stats.gather([q])
    assert s.paused is False  # nothing published: the queue's own settings
    redis_client.hset(q.keys.config, "paused", "1")
    (s,) = stats.gather([q])
    assert s.paused is True
    redis_client.hset(q.keys.config, "paused", "0")
    (s,) = stats.gather([q])
    assert s.paused is False
    paused_locally = make_queue(redis_client, "activation-sms", clock, paused=True)
    assert stats.gather([paused_locally])[0].paused is True


class CountingClient:
    """Wraps a client and records every command or pipeline sent through it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.sent: list[str] = []

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._client.pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted(*a: Any, **kw: Any) -> Any:
            self.sent.append(f"pipeline of {len(pipe.command_stack)}")
            return execute(*a, **kw)

        pipe.execute = counted
        return pipe

    def __getattr__(self, name: str) -> Any:
        self.sent.append(name)
        return getattr(self._client, name)


def test_all_queues_in_one_round_trip(redis_client, clock):
    names = ["a", "b", "c", "d"]
    for name in names:
        make_queue(redis_client, name, clock).schedule({"x": 1}, delay=5)
    spy = CountingClient(redis_client)
    stats.gather([make_queue(spy, n, clock) for n in names])  # first use loads the scripts
    spy.sent.clear()
    result = stats.gather([make_queue(spy, n, clock) for n in names])
    assert [s.counts["pending"] for s in result] == [1, 1, 1, 1]
    # counts, activity, flow state, timings, busiest flow keys, those waiting for a newer
    # consumer and the overdue backlog of each queue
    assert spy.sent == ["pipeline of 28"]


def test_scripts_reload_after_script_flush(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    q.schedule({"x": 1})
    redis_client.script_flush()
    (s,) = stats.gather([q])
    assert s.ok and s.counts["ready"] == 1


def test_redis_down_gives_none_not_an_exception(clock):
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    queues = [make_queue(dead, "a", clock), make_queue(dead, "b", clock, paused=True)]
    result = stats.gather(queues)
    assert [s.queue for s in result] == ["a", "b"]
    for s in result:
        assert s.counts == dict.fromkeys(("pending", "ready", "unack", "retry", "garbage"))
        assert s.consumers_alive is None and s.deliveries is None and s.failures is None
        assert not s.ok and "unavailable" in s.error.lower()
    assert [s.paused for s in result] == [False, True]  # from the settings, still shown
    assert result[0].to_dict()["counts"]["pending"] is None


def test_one_broken_queue_does_not_hide_the_others(redis_client, clock):
    good = make_queue(redis_client, "good", clock)
    bad = make_queue(redis_client, "bad", clock)
    good.schedule({"x": 1})
    redis_client.set(bad.keys.pending, "not a zset")  # counts.lua fails with WRONGTYPE
    redis_client.set(bad.keys.heartbeats, "not a zset")  # so does stats.lua
    s_good, s_bad = stats.gather([good, bad])
    assert s_good.ok and s_good.counts["ready"] == 1
    assert s_bad.counts["pending"] is None and s_bad.consumers_alive is None
    # counts.lua, stats.lua and overdue.lua (which reads pending too)
    assert len(s_bad.errors) == 3 and "WRONGTYPE" in s_bad.error
    assert s_bad.overdue_messages is None


def test_no_queues_no_round_trip():
    assert stats.gather([]) == []


# --- the Django side: collect() over the configured queues ----------------------------------


def test_collect_reads_the_configured_queues_in_settings_order(redis_client):
    from django_delayqueue.core import ConfigurationError

    q = Queue(redis_client, "activation-sms", prefix="dq")
    q.schedule({"store": 7}, delay=60)
    result = stats.collect()
    assert [s.queue for s in result] == ["order-close", "activation-sms"]
    assert result[1].counts["pending"] == 1 and result[0].counts["pending"] == 0
    assert [s.queue for s in stats.collect(["activation-sms"])] == ["activation-sms"]
    with pytest.raises(ConfigurationError, match="unknown queue 'nope'"):
        stats.collect(["order-close", "nope"])


def test_a_queue_whose_name_no_key_can_hold_does_not_hide_the_others(redis_client, settings):
    # A queue named with ':' (refused since by E004, but left in a settings file after an
    # upgrade): before, collect() raised for every queue, and the admin overview with it.
    settings.DELAYQUEUE = {
        **settings.DELAYQUEUE,
        "QUEUES": {"eu:orders": {}, **settings.DELAYQUEUE["QUEUES"]},
    }
    Queue(redis_client, "activation-sms", prefix="dq").schedule({"store": 7}, delay=60)
    bad, orders, sms = stats.collect()
    assert bad.queue == "eu:orders" and not bad.ok and "':'" in bad.error
    assert orders.ok and sms.ok and sms.counts["pending"] == 1


def test_collect_sees_what_the_settings_mirror_publishes(redis_client):
    from django_delayqueue.mirror.queue_overrides import publish

    publish({"order-close": {"paused": True, "max_attempts": 3}})
    paused, running = stats.collect()
    assert paused.paused is True and running.paused is False


def test_consumer_window_comes_from_the_settings(redis_client, settings):
    q = Queue(redis_client, "order-close", prefix="dq")
    redis_client.zadd(q.keys.heartbeats, {"slow": q.clock.now_ms() - 60_000})
    assert stats.collect(["order-close"])[0].consumers_alive == 0  # default window: 30 s
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "HEALTH_CONSUMER_SECONDS": 120}
    assert stats.consumer_alive_seconds() == 120
    assert stats.collect(["order-close"])[0].consumers_alive == 1


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (0.25, "250 ms"),
        (42.9, "42 s"),
        (192, "3 min 12 s"),
        (3600, "1 h"),
        (7500, "2 h 5 min"),
        (3 * 86400 + 4 * 3600 + 5, "3 d 4 h"),
    ],
)
def test_format_seconds(seconds, text):
    assert stats.format_seconds(seconds) == text


def test_ready_messages_held_back_by_a_flow_limit_are_not_overdue(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    q.settings = q.settings.replace(rate_limit="1/m")
    for n in range(3):
        q.schedule({"n": n}, at=clock.now_ms() - 30_000)  # due 30 s ago: overdue
    q.promote()
    (before,) = stats.gather([q])
    assert before.oldest_overdue_ms == 30_000 and before.flow.held is None
    assert len(q.claim(3)) == 1  # the limit holds the other two back
    (held,) = stats.gather([q])
    assert held.oldest_overdue_ms is None  # waiting on the limit, as asked: not late
    assert (held.flow.held, held.flow.waiting, held.counts["ready"]) == ("rate", 2, 2)
    # Due 5 s ago and not promoted (no consumer came by): late all the same.
    redis_client.zadd(q.keys.pending, {"stuck": clock.now_ms() - 5_000})
    (late,) = stats.gather([q])
    assert late.oldest_overdue_ms == 5_000


def test_a_hold_left_by_consumers_that_stopped_is_not_believed(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    q.settings = q.settings.replace(rate_limit="10/s")
    for n in range(3):
        q.schedule({"n": n})
    assert len(q.claim(3)) == 1
    (held,) = stats.gather([q])
    assert held.flow.held == "rate" and held.oldest_overdue_ms is None
    clock.advance(seconds=5)  # nobody claimed since: the limit no longer explains the wait
    (stale,) = stats.gather([q])
    assert stale.flow.held is None and stale.oldest_overdue_ms == 5000


def test_a_cap_held_by_killed_consumers_is_not_believed_past_their_deadlines(redis_client, clock):
    q = make_queue(redis_client, "order-close", clock)
    q.settings = q.settings.replace(max_in_flight=1)
    for n in range(3):
        q.schedule({"n": n})
    assert len(q.claim(3)) == 1  # the cap holds two back
    (held,) = stats.gather([q])
    assert held.flow.held == "in_flight" and held.oldest_overdue_ms is None
    # Every consumer killed -9: the claimed one stays in unack, its visibility deadline passes.
    clock.advance(seconds=q.settings.visibility_timeout + 600)
    (stalled,) = stats.gather([q])
    assert stalled.counts["unack"] == 1  # not reaped yet, yet nothing runs any more
    assert stalled.flow.held is None and stalled.oldest_overdue_ms is not None


@pytest.mark.parametrize(
    ("limit", "held_by"), [({"max_in_flight": 1}, "in_flight"), ({"rate_limit": "1/h"}, "rate")]
)
def test_a_limit_cleared_by_staff_leaves_no_hold_behind(redis_client, clock, limit, held_by):
    q = make_queue(redis_client, "order-close", clock)
    q.settings = q.settings.replace(**limit)
    for n in range(5):
        q.schedule({"n": n})
    assert len(q.claim(5)) == 1
    (held,) = stats.gather([q])
    assert held.flow.held == held_by
    q.settings = q.settings.replace(**dict.fromkeys(limit))  # cleared in the admin
    assert len(q.claim(1)) == 1  # claims without limits never touch the limiter
    clock.advance(seconds=1)
    (cleared,) = stats.gather([q])
    assert cleared.flow.held is None and cleared.flow.waiting == 0
    assert cleared.oldest_overdue_ms is not None
