"""``runqueue --processes N``: the supervisor and its consumer processes, for real.

Real ``runqueue`` processes (``drill.Runqueues``, the drill project) on a real Redis; the
drill receiver records every delivery in the ledger with its pid and its parent's (the
supervisor's), so a check can say which process ran what, and whether anything ran twice at
once, early, or not at all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from drill import Runqueues, producer, settled
from ledger import Causes, check, overlaps, read, read_runs
from paths import child_pythonpath

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def runqueues(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> Iterator[Runqueues]:
    group = Runqueues(redis_server.url, tmp_path)
    yield group
    group.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(runqueues: Runqueues, proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError("runqueue ignored SIGTERM:\n" + runqueues.logs()[-4000:]) from None


def test_a_child_killed_mid_handler_is_replaced_and_nothing_is_lost(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    """kill -9 of one child while its handlers run: the supervisor replaces it, the other
    child goes on, every message is delivered, the killed ones only after their visibility
    timeout (never beside the handler that was running), none early."""
    q = producer(redis_server.url, "drill")
    slow = [q.schedule({"do": ["sleep:30", "ok"]}).id for _ in range(4)]
    due = {r.id: r.due_ms for r in (q.schedule({"n": i}, delay=1.5) for i in range(20))}
    due.update(dict.fromkeys(slow, 0))
    sup = runqueues.start("--processes", "2", concurrency="2", claim_batch="1", visibility="2")
    first = runqueues.consuming_children(sup, 2)
    runqueues.wait(lambda: len(read(runqueues.ledger)) == 4, 30, "4 slow handlers running")
    victim = read(runqueues.ledger)[0].pid
    assert victim in first
    killed_at = {d.id: d.delivered_ms for d in read(runqueues.ledger) if d.pid == victim}
    os.kill(victim, signal.SIGKILL)
    runqueues.wait(
        lambda: f"consumer process {victim} died (signal SIGKILL" in runqueues.log(sup),
        30,
        "the supervisor to see the death",
    )
    runqueues.wait(
        lambda: len(runqueues.children(sup)) == 2 and victim not in runqueues.children(sup),
        30,
        "a replacement",
    )
    runqueues.wait(lambda: settled(q), 90, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    deliveries = read(runqueues.ledger)
    report = check(due, deliveries, Causes(killed_pids={victim}))
    assert report.ok, report.summary()
    assert report.duplicates == {"consumer killed mid-handler": len(killed_at)}
    again = [d for d in deliveries if d.id in killed_at and d.attempt == 2]
    assert {d.id for d in again} == set(killed_at)
    assert all(d.pid != victim and d.ppid == sup.pid for d in again)
    # Delivered again only after the 2 s visibility timeout from the victim's start (the
    # extender kept it in flight until the kill): never beside the killed handler.
    assert all(d.delivered_ms >= killed_at[d.id] + 1900 for d in again)


def test_recycling_by_message_count_replaces_the_child_without_a_gap(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    q = producer(redis_server.url, "drill")
    sup = runqueues.start("--max-messages-per-child", "10", claim_batch="2")
    (first,) = runqueues.consuming_children(sup, 1)
    # The first process serves on until its successor consumes, so on a slow machine it may
    # deliver every message scheduled so far: what comes after the handover shows the successor.
    ids = [q.schedule({"n": i}, delay=0.01 * i).id for i in range(30)]
    runqueues.wait(lambda: "consumes: stopping" in runqueues.log(sup), 60, "a recycling")
    runqueues.wait(lambda: first not in runqueues.children(sup), 60, "the first process gone")
    after = [q.schedule({"n": i}, delay=0.01 * i).id for i in range(30, 40)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    deliveries = read(runqueues.ledger)
    report = check(ids + after, deliveries)
    assert report.ok and not report.duplicates, report.summary()
    log = runqueues.log(sup)
    assert "--max-messages-per-child 10" in log
    assert len([d for d in deliveries if d.pid == first]) >= 10  # recycled after its 10th
    assert first not in {d.pid for d in deliveries if d.id in after}
    assert {d.ppid for d in deliveries} == {sup.pid}
    # The successor consumed before its predecessor was told to stop (no gap in service).
    for line in log.splitlines():
        if "consumes: stopping" in line:
            new = line.split("consumer process ")[1].split()[0]
            assert f"-{new} consuming " in log.split(line)[0]


def test_recycling_by_memory(runqueues: Runqueues, redis_server: RedisServerProcess) -> None:
    """A handler that keeps 200 MB alive pushes its process past --max-memory-per-child: it
    is replaced, and what comes after is delivered by the replacement."""
    q = producer(redis_server.url, "drill")
    sup = runqueues.start("--max-memory-per-child", "180", concurrency="1", claim_batch="1")
    (first,) = runqueues.consuming_children(sup, 1)
    big = q.schedule({"do": "hold:200"}).id
    runqueues.wait(lambda: "resident memory" in runqueues.log(sup), 60, "a recycling by memory")
    runqueues.wait(
        lambda: not _alive(first) or first not in runqueues.children(sup),
        60,
        "the big child to be gone",
    )
    after = [q.schedule({"n": i}).id for i in range(5)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    deliveries = read(runqueues.ledger)
    report = check([big, *after], deliveries)
    assert report.ok and not report.duplicates, report.summary()
    assert {d.pid for d in deliveries if d.id == big} == {first}
    assert first not in {d.pid for d in deliveries if d.id in after}


def test_sighup_replaces_the_children_one_by_one(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    q = producer(redis_server.url, "drill")
    sup = runqueues.start("--processes", "2", claim_batch="2")
    old = runqueues.consuming_children(sup, 2)
    ids = [q.schedule({"do": "sleep:0.05", "n": i}, delay=0.02 * i).id for i in range(150)]
    sup.send_signal(signal.SIGHUP)

    def replaced() -> set[int] | None:
        now = runqueues.children(sup)
        log = runqueues.log(sup)
        fresh = {pid for pid in now if f"-{pid} consuming " in log}
        return fresh if len(fresh) == 2 and not fresh & old and now == fresh else None

    new = runqueues.wait(replaced, 60, "both children replaced")
    runqueues.wait(lambda: settled(q), 60, "every message delivered")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    log = runqueues.log(sup)
    # One by one: each old child was told to stop only once a successor consumed.
    stops = [line for line in log.splitlines() if "consumes: stopping" in line]
    assert {int(line.rsplit(" ", 1)[1]) for line in stops} == old, stops
    assert {int(line.split("consumer process ")[1].split()[0]) for line in stops} == new
    report = check(ids, read(runqueues.ledger))
    assert report.ok and not report.duplicates, report.summary()


def test_sigterm_lets_every_child_finish_its_handlers(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    q = producer(redis_server.url, "drill")
    running = [q.schedule({"do": "sleep:2"}).id for _ in range(4)]
    waiting = [q.schedule({"n": i}, delay=0.5).id for i in range(6)]
    sup = runqueues.start(
        "--processes", "2", "--grace", "30", concurrency="2", claim_batch="1", visibility="20"
    )
    children = runqueues.consuming_children(sup, 2)
    runqueues.wait(lambda: len(read(runqueues.ledger)) == 4, 30, "4 handlers running")
    assert {d.pid for d in read(runqueues.ledger)} == children
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    assert not any(_alive(pid) for pid in children)
    # The four finished (their end lines are in the ledger, acknowledged), nothing else began.
    runs = read_runs(runqueues.ledger)
    assert sorted(r.id for r in runs) == sorted(running)
    counts = q.counts()
    assert counts["unack"] == 0 and counts["retry"] == 0, counts
    assert counts["ready"] + counts["pending"] == len(waiting)


def test_a_second_sigterm_stops_the_children_at_once(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    q = producer(redis_server.url, "drill")
    for _ in range(2):
        q.schedule({"do": ["sleep:60", "ok"]})
    sup = runqueues.start("--processes", "2", concurrency="1", claim_batch="1", visibility="5")
    # (one child may hold both: the second waits claimed, given back at the stop)
    runqueues.wait(lambda: read(runqueues.ledger), 60, "a handler running")
    sup.send_signal(signal.SIGTERM)
    runqueues.wait(
        lambda: "stopping 2 consumer process(es) gracefully" in runqueues.log(sup),
        30,
        "the first stop",
    )
    assert sup.poll() is None  # the handlers still run
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0  # not the 60 s of the handlers nor the 30 s grace
    counts = q.counts()
    assert counts["unack"] + counts["retry"] + counts["ready"] == 2, counts


def test_an_evicting_redis_is_refused_before_any_child_starts(
    runqueues: Runqueues, redis_client: redis.Redis
) -> None:
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        sup = runqueues.start("--processes", "2")
        assert sup.wait(60) == 1
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    log = runqueues.log(sup)
    assert "allkeys-lru" in log and "consumer process" not in log, log[-2000:]


def test_a_child_that_finds_a_configuration_error_stops_everything(
    runqueues: Runqueues, redis_client: redis.Redis
) -> None:
    """The Redis turned evicting while runqueue ran; a replacement child judges it at its
    start and refuses: the supervisor stops the other children and exits 1 with the message,
    instead of replacing the child for ever."""
    sup = runqueues.start("--processes", "2")
    first = runqueues.consuming_children(sup, 2)
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        os.kill(min(first), signal.SIGKILL)
        assert sup.wait(60) == 1, runqueues.log(sup)[-3000:]
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    log = runqueues.log(sup)
    assert "allkeys-lru" in log.split("died (signal SIGKILL")[1]
    assert not any(_alive(pid) for pid in first)
    assert log.count(" started (slot") == 3  # the two, and one replacement: not respawned


def test_queuestats_lists_each_child_under_its_supervisor(
    runqueues: Runqueues,
    redis_server: RedisServerProcess,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    q = producer(redis_server.url, "drill")
    busy = q.schedule({"do": "sleep:60"}).id
    sup = runqueues.start("--processes", "2", "--grace", "1", concurrency="1", visibility="5")
    children = runqueues.consuming_children(sup, 2)
    runqueues.wait(lambda: len(read(runqueues.ledger)) == 1, 30, "the busy handler")
    runner = read(runqueues.ledger)[0].pid
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "drill_settings",
        "PYTHONPATH": child_pythonpath(),
        "REDIS_URL": redis_server.url,
        "DRILL_LEDGER": str(tmp_path / "unused.jsonl"),
        "DRILL_DB": str(tmp_path / "drill.sqlite3"),
    }

    def stats() -> dict | None:
        out = subprocess.run(
            [sys.executable, "-m", "django", "queuestats", "drill", "--json"],
            env=env,
            capture_output=True,
            check=False,
            timeout=60,
        )
        (drill,) = json.loads(out.stdout)["queues"]
        busy_now = [c for c in drill["consumers"] if c.get("running_count")]
        return drill if drill["consumers_alive"] == 2 and busy_now else None

    drill = runqueues.wait(stats, 60, "both children in the heartbeats, one running")
    consumers = drill["consumers"]
    assert {c["pid"] for c in consumers} == children
    assert all(c["supervisor"]["pid"] == sup.pid for c in consumers)
    assert all(c["rss_bytes"] > 0 and c["handled"] == 0 for c in consumers)
    (running,) = [c for c in consumers if c["running_count"]]
    assert running["pid"] == runner and [r["id"] for r in running["running"]] == [busy]
    (supervisor,) = drill["supervisors"]
    assert supervisor["pid"] == sup.pid and len(supervisor["consumers"]) == 2

    text = subprocess.run(
        [sys.executable, "-m", "django", "queuestats", "drill"],
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
        text=True,
    ).stdout
    assert f"(pid {sup.pid})" in text and f"drill:{busy} for" in text
    assert all(str(pid) in text for pid in children)
    _stop(runqueues, sup)


def test_a_handler_past_its_time_limit_is_stopped_by_replacing_its_process(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """A handler blocked in a socket read with no timeout, past ``time_limit``: the watchdog
    cannot stop its thread, so its process reports it and stops; the supervisor starts a
    replacement at once and retries the message (attempt counted, reason "time limit
    exceeded") only once the old process is gone, so the retry never runs beside it. The other
    queue of the process is served meanwhile."""
    queues = {"drill": {"time_limit": 1, "visibility_timeout": 60}}
    runqueues = Runqueues(redis_server.url, tmp_path, {"DRILL_QUEUES": json.dumps(queues)})
    try:
        q = producer(redis_server.url, "drill")
        other = producer(redis_server.url, "drill2")
        hung = q.schedule({"do": ["block", "ok"]}).id
        sup = runqueues.start("--grace", "2", "--processes", "1", queues=["drill", "drill2"])
        (first,) = runqueues.consuming_children(sup, 1)
        runqueues.wait(lambda: len(read(runqueues.ledger)) == 1, 30, "the hung handler")
        runqueues.wait(
            lambda: "could not stop 1 handler(s)" in runqueues.log(sup), 30, "the time limit"
        )
        others = [other.schedule({"n": i}).id for i in range(5)]
        runqueues.wait(lambda: settled(other), 30, "the other queue served meanwhile")
        again = runqueues.wait(
            lambda: [d for d in read(runqueues.ledger) if d.id == hung and d.attempt == 2],
            60,
            "the retry",
        )
        # Retried only once the old process was reaped: it never ran beside its retry.
        assert not _alive(first)
        assert again[0].pid != first and again[0].ppid == sup.pid
        runqueues.wait(lambda: settled(q), 30, "the retry acknowledged")
        log = runqueues.log(sup)
        assert f"message {hung} stopped (time limit exceeded (1 s)): retried" in log
        assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
        report = check([hung, *others], read(runqueues.ledger))
        assert report.ok, report.summary() + runqueues.logs()
    finally:
        runqueues.close()


def test_the_supervised_runqueue_consumes_through_a_django_redis_cache_alias(
    tmp_path: Path, redis_server: RedisServerProcess
) -> None:
    """``CACHE_ALIAS``: the client is django-redis's own (cached by django-redis, inherited by
    every forked child). Both children consume, a child killed is replaced by one that consumes
    too, every message is delivered, none twice at once."""
    runqueues = Runqueues(redis_server.url, tmp_path, env={"DRILL_CACHE_ALIAS": "1"})
    q = producer(redis_server.url, "drill")
    due: dict[str, int] = {}
    try:
        sup = runqueues.start("--processes", "2", concurrency="2", claim_batch="1")
        first = runqueues.consuming_children(sup, 2)
        due.update({r.id: r.due_ms for r in (q.schedule({"n": i}) for i in range(20))})
        runqueues.wait(lambda: settled(q), 60, "the first messages delivered")
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        runqueues.wait(lambda: victim not in runqueues.children(sup), 30, "the kill reaped")
        runqueues.consuming_children(sup, 2)
        due.update({r.id: r.due_ms for r in (q.schedule({"n": i}) for i in range(20, 40))})
        runqueues.wait(lambda: settled(q), 60, "every message delivered")
        assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    finally:
        runqueues.close()
    report = check(due, read(runqueues.ledger), Causes(killed_pids={victim}))
    assert report.ok, report.summary()
    assert overlaps(read_runs(runqueues.ledger)) == []
    assert "Traceback" not in runqueues.logs(), runqueues.logs()[-3000:]


def test_children_that_keep_dying_at_start_are_reported_once_and_fail_the_probe(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    """Every child dies before it consumes: the supervisor logs the traceback once, then one
    line per death, and publishes "consumers keep dying at start: <error>", which the health
    probe (run as the web would, from the same settings) fails on; stopping clears it."""
    from paths import PROGRAMS

    sup = runqueues.start("--processes", "2", program=PROGRAMS / "child_start_fails.py")
    error = "RedisClusterException: drill: the cluster has no default node"
    runqueues.wait(
        lambda: redis.Redis.from_url(redis_server.url).hlen("{dq}:start-failures") == 1,
        60,
        "the start failure published",
    )
    runqueues.wait(
        lambda: runqueues.log(sup).count(f"failed again: {error}") >= 2, 60, "more deaths"
    )
    log = runqueues.log(sup)
    assert log.count("Traceback (most recent call last)") == 1, log[-4000:]
    assert f"keep dying at start (2 in a row): {error}" in log
    probe = subprocess.run(
        [sys.executable, "-c", HEALTH_PROBE],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "drill_settings",
            "PYTHONPATH": child_pythonpath(),
            "REDIS_URL": redis_server.url,
            "DRILL_LEDGER": str(runqueues.ledger),
            "DRILL_DB": str(runqueues.workdir / "drill.sqlite3"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(probe.stdout)
    assert report["checks"]["starting"]["ok"] is False, report
    assert report["checks"]["starting"]["failing"]["drill"] == (
        f"consumers keep dying at start: {error}"
    )
    assert _stop(runqueues, sup) == 0, runqueues.log(sup)[-3000:]
    assert redis.Redis.from_url(redis_server.url).hlen("{dq}:start-failures") == 0


HEALTH_PROBE = """
import json
import django
django.setup()
from django_delayqueue.monitoring.health import check_health
print(json.dumps(check_health()[1]))
"""


@pytest.mark.parametrize("via", ["to_thread", "executor", "sync_to_async"])
def test_an_async_handler_whose_thread_outlives_its_time_limit_gets_its_process_replaced(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis, via: str
) -> None:
    """An ``async def`` receiver awaiting a thread blocked in a socket read, past
    ``time_limit``: the cancel ends the coroutine, not the thread, so the delivery stays
    running (never retried beside it), is found unstoppable and its process replaced as a
    thread handler's is; the retry runs in the replacement, once the old process is gone."""
    queues = {"drill-async": {"time_limit": 1, "visibility_timeout": 60}}
    runqueues = Runqueues(redis_server.url, tmp_path, {"DRILL_QUEUES": json.dumps(queues)})
    try:
        q = producer(redis_server.url, "drill-async")
        hung = q.schedule({"do": ["block", "ok"], "via": via}).id
        sup = runqueues.start("--grace", "2", "--processes", "1", queues=["drill-async"])
        (first,) = runqueues.consuming_children(sup, 1)
        runqueues.wait(lambda: len(read(runqueues.ledger)) == 1, 30, "the hung handler")

        def retried() -> list[Any]:
            return [d for d in read(runqueues.ledger) if d.id == hung and d.attempt == 2]

        # The retry must not start while the thread runs: the process is replaced first.
        runqueues.wait(
            lambda: retried() or "could not stop 1 handler(s)" in runqueues.log(sup),
            30,
            "the time limit",
        )
        assert not retried(), runqueues.logs()[-3000:]
        again = runqueues.wait(retried, 60, "the retry")
        # Retried only once the old process was reaped: it never ran beside its retry.
        assert not _alive(first)
        assert again[0].pid != first and again[0].ppid == sup.pid
        runqueues.wait(lambda: settled(q), 30, "the retry acknowledged")
        log = runqueues.log(sup)
        assert f"message {hung} stopped (time limit exceeded (1 s)): retried" in log
        assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
        report = check([hung], read(runqueues.ledger))
        assert report.ok, report.summary() + runqueues.logs()
    finally:
        runqueues.close()


# --- --max-memory-per-child below what a consumer process starts with ------------------------


def test_a_memory_limit_below_a_fresh_process_is_refused_at_start(runqueues: Runqueues) -> None:
    """Issue 37: ``--max-memory-per-child 20`` (a fresh process is about 55 MB) was accepted
    silently, and the supervisor started 215-250 processes in 10 s. Refused before any
    process starts, with what this project's processes weigh."""
    sup = runqueues.start("--max-memory-per-child", "20")
    started = re.compile(r"consumer process \d+ started")
    runqueues.wait(
        lambda: sup.poll() is not None or len(started.findall(runqueues.log(sup))) > 3,
        60,
        "runqueue to refuse the limit (or to start processes)",
    )
    log = runqueues.log(sup)
    assert not started.findall(log), log[-3000:]
    assert sup.wait(30) == 1
    assert "CommandError: --max-memory-per-child 20 is below the memory every consumer" in log
    assert re.search(r"this runqueue holds \d+ MB of its own after setup", log), log[-3000:]


def _own_and_resident_mb(pid: int) -> tuple[float, float]:
    """A process's memory of its own (resident less file-backed) and its resident memory."""
    fields = Path(f"/proc/{pid}/statm").read_text().split()
    page = os.sysconf("SC_PAGE_SIZE")
    resident, shared = int(fields[1]) * page, int(fields[2]) * page
    return (resident - shared) / 1024**2, resident / 1024**2


def test_processes_that_outgrow_a_limit_right_after_their_start_are_not_a_fork_storm(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    """A limit above what the start refuses but below a fresh process's resident memory (the
    file pages it touches): each process asks to be replaced as it starts. The supervisor
    paces the replacements as a crash loop (0.5 s doubling); each serves until its successor
    consumes, so messages go on being delivered."""
    measured = runqueues.start()
    (child,) = runqueues.consuming_children(measured, 1)
    floor, _ = _own_and_resident_mb(measured.pid)
    _, fresh = _own_and_resident_mb(child)
    assert _stop(runqueues, measured) == 0
    assert fresh > floor + 2, (floor, fresh)
    limit = (floor + fresh) / 2
    sup = runqueues.start("--max-memory-per-child", f"{limit:.0f}")
    started = re.compile(r"consumer process \d+ started")
    paced = "is replaced in 2.0s, not at once"
    runqueues.wait(
        lambda: paced in runqueues.log(sup) or len(started.findall(runqueues.log(sup))) > 12,
        60,
        "the third paced replacement (or a storm)",
    )
    log = runqueues.log(sup)
    before = log.split(paced)[0]
    # By the third paced replacement: the first process, the one replaced at once, and the
    # two replaced after 0.5 s and 1 s. Before: a dozen within a second or two.
    assert len(started.findall(before)) == 4, log[-4000:]
    assert "is replaced in 0.5s, not at once" in before and "in 1.0s, not at once" in before
    q = producer(redis_server.url, "drill")
    ids = [q.schedule({"n": i}).id for i in range(5)]
    runqueues.wait(lambda: settled(q), 60, "every message delivered meanwhile")
    assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    report = check(ids, read(runqueues.ledger))
    assert report.ok and not report.duplicates, report.summary()


# --- the supervisor as the last line of defence -------------------------------------------------


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not reaped yet by whoever adopted it, does
    not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _in_groups(groups: set[int]) -> set[int]:
    """The running processes of the process groups ``groups`` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.add(int(entry.name))
    return found


def _programs(runqueues: Runqueues) -> list[int]:
    """The pids of the programs the ``program`` action started, in order."""
    path = Path(f"{runqueues.ledger}.programs")
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_a_process_stuck_in_a_call_that_holds_the_gil_is_killed_before_its_lease_ends(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """A handler in a C call that holds the GIL (``gil``): no thread of its process runs, not
    its watchdog, not the renewal of its lease, not its heartbeat. The supervisor kills the
    silent process (and its group) before the lease can end and, once it has reaped it,
    retries the message with its delivery token still current: nothing delivered it meanwhile,
    and the retry never runs beside the stuck run, which never ends. (Before: with these
    settings the retry started at 5 s in the other process, the first run ended at 13 s.)"""
    queues = {"drill": {"time_limit": 2, "visibility_timeout": 4}}
    runqueues = Runqueues(redis_server.url, tmp_path, {"DRILL_QUEUES": json.dumps(queues)})
    try:
        q = producer(redis_server.url, "drill")
        sup = runqueues.start("--processes", "2", concurrency="1", claim_batch="1")
        runqueues.consuming_children(sup, 2)
        stuck = q.schedule({"do": ["gil:20", "ok"]}).id
        (first,) = runqueues.wait(lambda: read(runqueues.ledger), 30, "the handler holding the GIL")
        runqueues.wait(
            lambda: f"consumer process {first.pid} has not answered" in runqueues.log(sup),
            30,
            "the silent process killed",
        )
        again = runqueues.wait(
            lambda: [d for d in read(runqueues.ledger) if d.id == stuck and d.attempt == 2],
            60,
            "the retry",
        )
        runqueues.wait(lambda: settled(q), 30, "the retry acknowledged")
        assert not _running(first.pid)
        assert again[0].pid != first.pid and again[0].ppid == sup.pid
        log = runqueues.log(sup)
        # Retried by the supervisor once the process was reaped, its token still current (a
        # delivery meanwhile would read "left alone"); with its time limit's reason, as the
        # kill came past it (or as stopped answering, had it come a moment before).
        settled_line = next(line for line in log.splitlines() if f"message {stuck} stopped" in line)
        assert settled_line.endswith(": retried"), settled_line
        assert "time limit exceeded (2 s)" in settled_line or "stopped answering" in settled_line
        assert "a C call that holds the GIL" in log
        assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
        # The first run never ended (killed in its C call): one end, attempt 2's.
        runs = [(r.attempt, r.pid) for r in read_runs(runqueues.ledger) if r.id == stuck]
        assert runs == [(2, again[0].pid)]
        assert [d.attempt for d in read(runqueues.ledger)] == [1, 2]
    finally:
        runqueues.close()


def test_what_a_silent_process_claimed_and_never_started_comes_back_with_no_attempt_used(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """A process stuck in a C call that holds the GIL had claimed messages ahead of its one
    busy handler thread. Killed for its silence and reaped, its supervisor gives those back at
    once from the start marks the process left (release.lua): they run in the replacement on
    the attempt they were claimed at, not after their visibility timeout with an attempt used
    (before: each such kill charged them one, and three dead-lettered them unrun). The GIL
    holder itself had started: it is retried, its attempt counted (by the supervisor if a beat
    named it running, else by its visibility timeout)."""
    queues = {"drill": {"visibility_timeout": 4}}
    runqueues = Runqueues(redis_server.url, tmp_path, {"DRILL_QUEUES": json.dumps(queues)})
    try:
        q = producer(redis_server.url, "drill")
        sup = runqueues.start("--processes", "1", concurrency="1", claim_batch="10")
        (first,) = runqueues.consuming_children(sup, 1)
        # Quick handlers first: the thread measures their pace and holds messages ahead.
        warm = [q.schedule({"n": i}).id for i in range(30)]
        runqueues.wait(lambda: len(read(runqueues.ledger)) == len(warm), 60, "the warm-up")
        stuck = q.schedule({"do": ["gilgo:30", "ok"]}).id
        runqueues.wait(
            lambda: any(d.id == stuck for d in read(runqueues.ledger)), 30, "the holder started"
        )
        ahead = [q.schedule({"n": 100 + i}).id for i in range(3)]
        claimed = runqueues.wait(
            lambda: [i for i in ahead if redis_client.zscore(q.keys.unack, i) is not None],
            30,
            "messages claimed ahead of the busy thread",
        )
        assert first in runqueues.children(sup)  # by the process about to fall silent
        Path(f"{runqueues.ledger}.go").touch()
        runqueues.wait(
            lambda: f"consumer process {first} has not answered" in runqueues.log(sup),
            30,
            "the silent process killed",
        )
        runqueues.wait(lambda: settled(q), 60, "every message settled")
        assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
        deliveries = read(runqueues.ledger)
        attempts = {i: [d.attempt for d in deliveries if d.id == i] for i in [stuck, *ahead]}
        assert attempts == {stuck: [1, 2], **{i: [1] for i in ahead}}, attempts
        assert all(d.pid != first for d in deliveries if d.id in claimed)
        assert not redis_client.hlen(q.keys.attempts)  # every one acknowledged
        log = runqueues.log(sup)
        line = next(line for line in log.splitlines() if "never started given back" in line)
        assert f"consumer process {first} claimed" in line and "(no attempt used)" in line
        assert all(i in line for i in claimed), line
    finally:
        runqueues.close()


def test_a_program_a_handler_started_dies_when_its_process_is_replaced(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """A handler waiting for ``sleep 600`` it started (``subprocess.run`` with no timeout) past
    its time limit: its process is replaced, and the program dies with it (its process group)
    instead of living on re-parented to pid 1; the retry starts its own copy only then."""
    queues = {"drill": {"time_limit": 1, "visibility_timeout": 60}}
    runqueues = Runqueues(redis_server.url, tmp_path, {"DRILL_QUEUES": json.dumps(queues)})
    try:
        q = producer(redis_server.url, "drill")
        sup = runqueues.start("--grace", "2", "--processes", "1")
        (first,) = runqueues.consuming_children(sup, 1)
        stuck = q.schedule({"do": ["program:600", "program:0.2", "ok"]}).id
        (program,) = runqueues.wait(lambda: _programs(runqueues), 30, "the program started")
        runqueues.wait(
            lambda: "could not stop 1 handler(s)" in runqueues.log(sup), 30, "the time limit"
        )
        runqueues.wait(lambda: settled(q), 60, "the retry acknowledged")
        runqueues.wait(lambda: not _running(first), 30, "the old process gone")
        assert not _running(program), "the program outlived its consumer process"
        assert not _in_groups({first})
        retry = [d for d in read(runqueues.ledger) if d.id == stuck and d.attempt == 2]
        assert retry and retry[0].pid != first
        assert len(_programs(runqueues)) == 2  # the retry's own, once the first was gone
        assert _stop(runqueues, sup) == 0, runqueues.logs()[-3000:]
    finally:
        runqueues.close()


def test_kill_9_of_the_supervisor_leaves_no_program_behind(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    """``kill -9`` of the supervisor: its consumer processes die with it (PR_SET_PDEATHSIG),
    and so does what their handlers started (``sleep 600``), which nothing would kill
    otherwise: each process's guard kills its group once the process is gone."""
    q = producer(redis_server.url, "drill")
    sup = runqueues.start("--processes", "2", concurrency="1", claim_batch="1", visibility="5")
    children = runqueues.consuming_children(sup, 2)
    q.schedule({"do": "program:600"})
    (program,) = runqueues.wait(lambda: _programs(runqueues), 30, "the program started")
    sup.kill()
    sup.wait(30)
    runqueues.wait(lambda: not any(map(_running, children)), 30, "the processes gone")
    runqueues.wait(lambda: not _running(program), 30, "the program gone")
    # The groups' guards too, once they have killed their group (each exits right after).
    runqueues.wait(lambda: not _in_groups(children), 30, "the groups empty")


def test_a_handler_that_kills_its_process_on_every_message_gets_the_crash_loop_backoff(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    """A forked child says it consumes before its first handler runs; a handler that then
    kills its process is a crash loop all the same: replaced at once the first time, then
    after 0.5 s, 1 s, 2 s, 4 s (before: at once, every time)."""
    q = producer(redis_server.url, "drill")
    sup = runqueues.start(concurrency="1", claim_batch="1", max_attempts="10")
    runqueues.consuming_children(sup, 1)
    for _ in range(10):
        q.schedule({"do": "exit"})

    def deaths() -> list[str] | None:
        found = [
            line.rsplit(": ", 1)[1]
            for line in runqueues.log(sup).splitlines()
            if " died (exit code 3)" in line
        ]
        return found if len(found) >= 5 else None

    found = runqueues.wait(deaths, 90, "five deaths")
    assert found[:5] == [
        "replaced now",
        "replaced in 0.5s",
        "replaced in 1.0s",
        "replaced in 2.0s",
        "replaced in 4.0s",
    ], found


def test_sigterm_while_a_process_is_replaced_for_a_hung_handler_exits_0(
    tmp_path: Path, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    """SIGTERM right after a process reported a handler it could not stop: every process stops
    gracefully, the stopped message is retried once its process is gone, and runqueue exits 0
    as the docs say (the process being replaced ends as decided before the stop)."""
    queues = {"drill": {"time_limit": 1, "visibility_timeout": 60}}
    runqueues = Runqueues(redis_server.url, tmp_path, {"DRILL_QUEUES": json.dumps(queues)})
    try:
        q = producer(redis_server.url, "drill")
        sup = runqueues.start("--grace", "2", "--processes", "1")
        runqueues.consuming_children(sup, 1)
        hung = q.schedule({"do": ["block", "ok"]}).id
        runqueues.wait(
            lambda: "could not stop 1 handler(s)" in runqueues.log(sup), 30, "the time limit"
        )
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(60) == 0, runqueues.log(sup)[-3000:]
        assert f"message {hung} stopped (time limit exceeded (1 s)): retried" in runqueues.log(sup)
    finally:
        runqueues.close()


def test_a_stop_while_a_process_fails_to_start_exits_0(
    runqueues: Runqueues, redis_server: RedisServerProcess
) -> None:
    """SIGTERM while a consumer process is starting, and it then dies of its start-up error:
    a start failure (logged with its error), not a failure of the stop (before, exit 1 or 0
    by whether a process happened to be starting when the stop came)."""
    from paths import PROGRAMS

    sup = runqueues.start(program=PROGRAMS / "child_start_fails.py", start_seconds="3")
    runqueues.wait(lambda: " started (slot 1)" in runqueues.log(sup), 60, "a process starting")
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(60) == 0, runqueues.log(sup)[-3000:]
    assert "stopped with exit code 1: RedisClusterException" in runqueues.log(sup)
