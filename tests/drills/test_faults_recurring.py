"""A recurring schedule through real ``runqueue`` processes killed with ``kill -9`` at random.

Three runqueues keep an every-second schedule whose handler takes 300 ms; one at a time is
killed (mid-handler, mid-round, or idle: wherever it is) and replaced, for a dozen seconds.
The ledger then proves, for every tick from the first to the last awaited: delivered, never
early, and delivered twice only where a killed consumer was running it (at least once).

Two things of the drill's own making are waited for, never assumed to be quick:

- Ticks are not delivered in order. A tick held by a killed consumer comes back only after its
  visibility timeout and the next reap (a consumer's maintenance, every few seconds), and a
  backlog is claimed by several consumers at once. So the drill stops the runqueues only once
  *every* tick up to the last awaited is in the ledger, not as soon as the last one is.
- A replacement takes seconds to start on a loaded machine. A victim is only taken while at
  least one other runqueue consumes, so that the schedule is always kept by someone: the drill
  is about consumers dying beside others, not about an outage of all of them (catch-up).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from drill import Runqueues
from ledger import Causes, check, read

from django_delayqueue.core.recurring import parse_tick_id, tick_id
from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow

SCHEDULE = "drill-beat"
KILLS = 8


@pytest.fixture
def runqueues(tmp_path: Path, redis_server: RedisServerProcess) -> Iterator[Runqueues]:
    schedules = {
        SCHEDULE: {"queue": "drill", "every": 1, "payload": {"do": "sleep:0.3"}, "catch_up": "all"}
    }
    group = Runqueues(redis_server.url, tmp_path, env={"DRILL_SCHEDULES": json.dumps(schedules)})
    yield group
    group.close()


def ticks(path: Path) -> list[int]:
    return sorted(parsed[1] for d in read(path) if (parsed := parse_tick_id(d.id)))


def victim_index(rng: random.Random, live: list[subprocess.Popen[bytes]], ledger: Path) -> int:
    """Half the time the runqueue that ran the latest tick, else any: one consumer often wins
    every claim, and a victim taken at random would seldom be the one in a handler."""
    latest = read(ledger)[-1]
    holders = [i for i, proc in enumerate(live) if latest.ran_under(proc.pid)]
    if holders and rng.random() < 0.5:
        return holders[0]
    return rng.randrange(len(live))


def test_ticks_survive_consumers_killed_at_random(
    runqueues: Runqueues, redis_client: redis.Redis
) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    live = [runqueues.start(visibility="2") for _ in range(3)]
    runqueues.wait(lambda: len(ticks(runqueues.ledger)) >= 2, 60, "the first ticks")
    killed: set[int] = set()
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.2, 1.5))  # the drill's pace, not a condition of the test
        # Any runqueue may die, started or not, as long as another one consumes meanwhile.
        runqueues.wait(
            lambda: sum(map(runqueues.consuming, live)) >= 2, 60, "two runqueues consuming"
        )
        victim = live.pop(victim_index(rng, live, runqueues.ledger))
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed.add(victim.pid)
        live.append(runqueues.start(visibility="2"))
    # Every tick up to a few seconds after the last kill must arrive, each in its own time: a
    # tick a killed consumer held comes back after its visibility timeout and a reap.
    last = (int(time.time() * 1000) // 1000 + 3) * 1000
    first = ticks(runqueues.ledger)[0]
    expected = {tick_id(SCHEDULE, t): t for t in range(first, last + 1, 1000)}

    def missing() -> list[str]:
        return sorted(set(expected) - {d.id for d in read(runqueues.ledger)})

    try:
        runqueues.wait(lambda: not missing(), 120, f"every tick from {first} to {last}")
    except AssertionError as e:
        raise AssertionError(f"seed {seed}: ticks not delivered: {missing()}\n{e}") from None
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    for proc in live:
        proc.wait(40)
    deliveries = [d for d in read(runqueues.ledger) if d.id in expected]
    report = check(expected, deliveries, Causes(killed_pids=killed))
    print(report.summary())
    assert report.ok, f"seed {seed}: {report.summary()}\n{runqueues.logs()[-3000:]}"
    assert set(expected) <= {d.id for d in deliveries}  # not one tick skipped
