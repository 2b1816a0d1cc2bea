"""core.scripts: .lua files loaded once, EVALSHA, NOSCRIPT recovery, errors."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayqueue.core import ManualClock, Queue, RedisUnavailable, ScriptFailed
from django_delayqueue.core.scripts.calls import (
    LuaScript,
    ScriptBatch,
    script_names,
    with_shared_functions,
)
from django_delayqueue.embedded import free_port

NO_RETRY = Retry(NoBackoff(), 0)  # redis-py retries connection errors by default

LUA_NAMES = script_names()

ECHO_KEYS = """-- test script
-- returns KEYS[1] and ARGV[1]"""


def test_every_transition_ships_as_a_lua_file() -> None:
    expected = {
        "schedule", "promote", "claim", "ack", "nack", "reap", "release", "extend",
        "cancel", "run_now", "requeue", "purge", "counts", "peek", "journal",
    }  # fmt: skip
    assert expected <= set(LUA_NAMES)


def test_a_script_gets_the_shared_functions_it_calls_in_turn_defined_first() -> None:
    # ack.lua calls succeed(), which calls place() and envelope_times(): a local function is
    # visible only after its definition, so those come first, and unused ones not at all.
    source = with_shared_functions("-- t: test\nreturn succeed(KEYS[1], 1)")
    defined = re.findall(r"^local function (\w+)\(", source, re.MULTILINE)
    assert defined == ["envelope_times", "place", "succeed"]


@pytest.mark.parametrize("name", LUA_NAMES)
def test_every_script_opens_with_its_contract(name: str) -> None:
    source = (
        resources.files("django_delayqueue.core.scripts.lua").joinpath(f"{name}.lua").read_text()
    )
    header = [line for line in source.splitlines() if line.startswith("--")]
    text = "\n".join(header)
    assert source.startswith(f"-- {name}:")
    assert "KEYS[1]" in text and "returns" in text
    # Keys arrive through KEYS, never spelled in the script (that would break the cluster slot).
    body = "\n".join(line for line in source.splitlines() if not line.startswith("--"))
    assert not re.search(r"['\"]\{", body), "a key name is built inside the script"


def test_scripts_are_loaded_once_and_hashed_like_redis(redis_client: redis.Redis) -> None:
    script = LuaScript.named("counts")
    assert LuaScript.named("counts") is script
    assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
    assert redis_client.script_load(script.source) == script.sha


def test_a_script_call_loads_the_script_when_redis_does_not_know_it(
    redis_client: redis.Redis,
) -> None:
    script = LuaScript.named("counts")
    redis_client.script_flush()
    assert redis_client.script_exists(script.sha) == [False]
    keys = [f"{{t}}:{i}" for i in range(8)]
    assert script(redis_client, keys, [])[:5] == [0, 0, 0, 0, 0]
    assert redis_client.script_exists(script.sha) == [True]


def test_queue_operations_survive_script_flush(redis_client: redis.Redis) -> None:
    clock = ManualClock()
    q = Queue(redis_client, "q", clock=clock)
    assert q.schedule({"n": 1}, delay=1).created
    redis_client.script_flush()
    assert q.schedule({"n": 2}).created
    clock.advance(1)
    redis_client.script_flush()
    assert q.promote().moved == 1
    redis_client.script_flush()
    claimed = q.claim(10)
    assert sorted(m.payload["n"] for m in claimed) == [1, 2]
    redis_client.script_flush()
    assert q.ack(*claimed) == 2
    assert q.counts() == dict.fromkeys(("pending", "ready", "unack", "retry", "garbage"), 0)


def test_batch_after_script_flush_runs_every_call_once_in_order(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q", clock=ManualClock())
    redis_client.script_flush()
    result = q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(10)], chunk_size=3)
    assert (result.scheduled, result.duplicates) == (10, 0)
    # Each id once, in the order given (a re-run after NOSCRIPT must not duplicate or reorder).
    assert redis_client.lrange(q.keys.ready, 0, -1) == [f"m{i}".encode() for i in range(10)]


def test_mixed_batch_after_script_flush(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q", clock=ManualClock())
    q.schedule("a", id="a")
    q.schedule("b", id="b")
    redis_client.script_load(LuaScript.named("counts").source)  # one known, the others not
    batch = ScriptBatch()
    batch.add(*q.counts_call())
    batch.add(*q.claim_call(q.clock.now_ms(), 1))
    batch.add(*q.promote_call(q.clock.now_ms()))
    batch.add(*q.claim_call(q.clock.now_ms(), 1))
    redis_client.script_flush()
    counts, first, promoted, second = batch.run(redis_client)
    assert counts[:2] == [0, 2]
    assert first[0] == b"a" and second[0] == b"b"
    assert promoted[0] == 0
    assert redis_client.llen(q.keys.ready) == 0


def test_a_failing_script_raises_script_failed(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q", clock=ManualClock())
    redis_client.set(q.keys.pending, "not a zset")
    with pytest.raises(ScriptFailed, match="schedule") as info:
        q.schedule("x", delay=5)
    assert isinstance(info.value.__cause__, redis.ResponseError)


def test_a_batch_returns_errors_in_place_or_raises_naming_the_script(
    redis_client: redis.Redis,
) -> None:
    good = Queue(redis_client, "good", clock=ManualClock())
    bad = Queue(redis_client, "bad", clock=ManualClock())
    redis_client.set(bad.keys.pending, "not a zset")
    batch = ScriptBatch()
    batch.add(*good.counts_call())
    batch.add(*bad.counts_call())
    results = batch.run(redis_client, raise_errors=False)
    assert results[0][:5] == [0, 0, 0, 0, 0]
    assert isinstance(results[1], redis.ResponseError)
    with pytest.raises(ScriptFailed, match=r"counts\.lua failed"):
        batch.run(redis_client)


def test_empty_batch_sends_nothing(redis_client: redis.Redis) -> None:
    assert ScriptBatch().run(redis_client) == []


def test_unreachable_redis_raises_redis_unavailable() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=NO_RETRY)
    q = Queue(client, "q", clock=ManualClock())
    with pytest.raises(RedisUnavailable, match="schedule") as info:
        q.schedule("x")
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    with pytest.raises(RedisUnavailable, match="schedule"):
        q.schedule_many([{"payload": 1}])
    with pytest.raises(RedisUnavailable, match="pipeline"):
        batch = ScriptBatch()
        batch.add(LuaScript.named("counts"), q.keys.all_keys()[:6], [])
        batch.run(client)
