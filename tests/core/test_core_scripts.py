"""core.scripts: .lua files loaded once, EVALSHA, NOSCRIPT recovery, errors."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayqueue.core import (
    ConfigurationError,
    ManualClock,
    Queue,
    RedisUnavailable,
    ScriptFailed,
)
from django_delayqueue.core.scripts import loader
from django_delayqueue.core.scripts.calls import LuaScript, ScriptBatch, ScriptCall
from django_delayqueue.core.scripts.loader import render, script_names
from django_delayqueue.embedded import RedisServerProcess, free_port

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


def fake_lua(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    monkeypatch.setattr(loader, "read_lua", lambda path: files[path])
    monkeypatch.setattr(loader, "script_names", lambda: [n[:-4] for n in files if "/" not in n])


def test_an_include_is_replaced_by_its_file_depth_first_and_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_lua(
        monkeypatch,
        {
            "s.lua": '-- s\n--- @include "includes/b.lua"\n--- @include "includes/a.lua"\nbody()\n',
            "includes/a.lua": "local function a() end\n",
            "includes/b.lua": '--- @include "includes/a.lua"\nlocal function b() a() end\n',
        },
    )
    assert render("s") == (
        "-- s\nlocal function a() end\nlocal function b() a() end\n"
        "-- (included above: includes/a.lua)\nbody()\n"
    )


def test_an_include_cycle_or_a_missing_include_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_lua(
        monkeypatch,
        {
            "s.lua": '--- @include "includes/a.lua"\n',
            "includes/a.lua": '--- @include "includes/b.lua"\n',
            "includes/b.lua": '--- @include "includes/a.lua"\n',
        },
    )
    with pytest.raises(
        ConfigurationError,
        match=re.escape("include cycle: s.lua -> includes/a.lua -> includes/b.lua"),
    ):
        render("s")
    with pytest.raises(ConfigurationError, match="no script 'nope'"):
        render("nope")


def test_a_missing_include_file_is_named() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("no Lua file 'includes/nope.lua'")):
        loader.read_lua("includes/nope.lua")


@pytest.mark.parametrize("name", LUA_NAMES)
def test_what_a_script_runs_is_what_its_files_say(name: str) -> None:
    # No hidden preprocessing: the source sent is the file with its @include lines replaced by
    # the named files, so every other line of the file is in it, in order, unchanged.
    own = loader.read_lua(f"{name}.lua")
    sent = LuaScript.named(name).source
    assert sent == render(name)
    kept = [line for line in own.splitlines() if not line.startswith("--- @include")]
    position = 0
    for line in kept:
        position = sent.index(line, position)
    # A helper the script calls is defined in what is sent (not spliced in by name).
    for helper in re.findall(r"^local function (\w+)\(", sent, re.MULTILINE):
        assert sent.index(f"local function {helper}(") < sent.rindex(f"{helper}(")


def test_the_command_line_lists_and_renders_the_scripts() -> None:
    command = [sys.executable, "-m", "django_delayqueue.core.scripts"]
    listed = subprocess.run([*command, "list"], capture_output=True, text=True, check=True)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == LUA_NAMES
    assert f"schedule   {LuaScript.named('schedule').sha}" in listed.stdout
    shown = subprocess.run([*command, "render", "schedule"], capture_output=True, text=True)
    assert shown.stdout == LuaScript.named("schedule").source
    wrong = subprocess.run([*command, "render", "nope"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "no script 'nope'" in wrong.stderr


def test_the_rendered_source_runs_with_redis_cli_eval(
    redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    redis_cli = shutil.which("redis-cli")
    if redis_cli is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("redis-cli is missing (Debian: redis-tools)")
        pytest.skip("redis-cli is not installed")
    script = tmp_path / "schedule.lua"
    script.write_text(render("schedule"))  # what `python -m ...core.scripts render` prints
    q = "{cli:q}"
    keys = [f"{q}:{k}" for k in ("pending", "ready", "messages", "unack", "retry", "garbage")]
    now = 1_700_000_000_000
    args = [now, 2000, f"{q}:wake", "m1", now + 60_000, "envelope-1"]
    port = str(redis_server.port)
    out = subprocess.run(
        [redis_cli, "-p", port, "--eval", str(script), *keys, ",", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.split() == ["1"]  # one message scheduled
    assert redis_client.zscore(keys[0], "m1") == now + 60_000
    assert redis_client.hget(keys[2], "m1") == b"envelope-1"


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


@pytest.mark.parametrize("name", LUA_NAMES)
def test_a_script_that_takes_the_time_takes_it_first(name: str) -> None:
    # One convention for every script: ARGV[1] is the time when the script reads one, then its
    # own parameters, then repeated items (a call helper's fixed prefix no longer decides).
    header = [line for line in loader.read_lua(f"{name}.lua").splitlines() if line.startswith("--")]
    argv = " ".join(line for line in header if "ARGV[" in line)
    if "now (ms)" in argv:
        assert "ARGV[1] now (ms)" in argv, argv


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
    keys = [f"{{t}}:{i}" for i in range(10)]
    assert ScriptCall(script, keys, []).run(redis_client)[:5] == [0, 0, 0, 0, 0]
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
    assert (result.scheduled, result.already_present) == (10, 0)
    # Each id once, in the order given (a re-run after NOSCRIPT must not duplicate or reorder).
    assert redis_client.lrange(q.keys.ready, 0, -1) == [f"m{i}".encode() for i in range(10)]


def test_mixed_batch_after_script_flush(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q", clock=ManualClock())
    q.schedule("a", id="a")
    q.schedule("b", id="b")
    redis_client.script_load(LuaScript.named("counts").source)  # one known, the others not
    batch = ScriptBatch()
    batch.add(q.counts_call(q.clock.now_ms()))
    batch.add(q.claim_call(q.clock.now_ms(), 1))
    batch.add(q.promote_call(q.clock.now_ms()))
    batch.add(q.claim_call(q.clock.now_ms(), 1))
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
    batch.add(good.counts_call(good.clock.now_ms()))
    batch.add(bad.counts_call(bad.clock.now_ms()))
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
        batch.add(ScriptCall(LuaScript.named("counts"), q.keys.all_keys()[:6], []))
        batch.run(client)
