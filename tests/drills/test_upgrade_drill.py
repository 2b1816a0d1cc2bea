"""The mixed-version drill (docs/upgrades.md): real ``runqueue`` processes of two releases side
by side with producers of the other, in either order; nothing dead-lettered, every message
delivered once a consumer that reads it runs.

"The previous release" is the last commit before envelope formats (:data:`PREVIOUS_RELEASE`),
extracted from this checkout's git history and put first on the child's ``PYTHONPATH``: its
``runqueue``, its Lua scripts, its producer. A consumer "of the previous format" is this
release's ``runqueue`` pinned to ENVELOPE_FORMAT - 1 (``DELAYQUEUE["ENVELOPE_FORMAT"]``), what
every later format is drilled against.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from drill import Runqueues, producer, settled
from ledger import check, read
from paths import PROGRAMS, ROOT, child_pythonpath

from django_delayqueue.core import Queue
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, encode_envelope, encode_payload
from django_delayqueue.core.results import Prepared
from django_delayqueue.embedded import RedisServerProcess
from django_delayqueue.monitoring.stats import gather

pytestmark = pytest.mark.slow

PREVIOUS_RELEASE = "0cc4333773d8b906689be4d5724c005c7d447fb1"  # main before envelope formats
NEW, PREVIOUS = ENVELOPE_FORMAT, ENVELOPE_FORMAT - 1
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
COUNT = 3


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package and demo project of :data:`PREVIOUS_RELEASE`, in a directory of their own."""
    where = tmp_path_factory.mktemp("previous-release")
    try:
        archive = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "archive",
                PREVIOUS_RELEASE,
                "django_delayqueue",
                "demo_project",
            ],
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"release {PREVIOUS_RELEASE[:7]} is not in this checkout's git history: {e}")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    found = subprocess.run(
        [sys.executable, "-c", "import django_delayqueue as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": child_pythonpath(where)},
        cwd=where,  # not this checkout: a child's path starts with its working directory
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found.startswith(str(where)), found  # the child imports that release, not this one
    return where


@pytest.fixture
def runqueues(tmp_path: Path, redis_server: RedisServerProcess) -> Iterator[Runqueues]:
    group = Runqueues(redis_server.url, tmp_path)
    yield group
    group.close()


def previous(runqueues: Runqueues, release: Path) -> Runqueues:
    """The same drill's runqueues, of the previous release (same ledger, same logs folder)."""
    env = {"PYTHONPATH": child_pythonpath(release)}
    older = Runqueues(runqueues.url, runqueues.workdir, env, cwd=release)
    older.procs = runqueues.procs  # one list: the fixture kills whatever is left of both
    return older


def schedule_every_kind(q: Queue, prefix: str, format: int | None = None) -> dict[str, int]:
    """``COUNT`` messages of each kind this release writes (plain, keyed, traced), in
    ``format`` (None: the lowest that holds each, what every producer writes)."""
    due = {}
    for i in range(COUNT):
        for kind, key, trace in (
            ("plain", None, ""),
            ("keyed", f"s{i % 2}", ""),
            ("traced", None, TRACE),
        ):
            now = q.clock.now_ms()
            payload = encode_payload({"n": i})
            envelope = encode_envelope(payload, now, now, key=key, trace=trace, format=format)
            message_id = f"{prefix}-{kind}-{i}"
            assert q.send_prepared(Prepared(message_id, now, envelope)).created
            due[message_id] = now
    return due


def burst(group: Runqueues, **env: str) -> str:
    proc = group.start("--burst", **env)
    assert proc.wait(120) == 0, group.log(proc)
    return group.log(proc)


def delivered_once(ledger: Path, due: dict[str, int]) -> None:
    deliveries = [d for d in read(ledger) if d.id in due]
    report = check(due, deliveries)
    assert report.ok, report
    assert sorted(d.id for d in deliveries) == sorted(due), "each delivered exactly once"


def test_a_runqueue_of_the_previous_release_reads_all_this_release_writes(
    runqueues: Runqueues, redis_server: RedisServerProcess, previous_release: Path
) -> None:
    q = producer(redis_server.url, "drill")
    due = schedule_every_kind(q, "new")
    burst(previous(runqueues, previous_release))
    delivered_once(runqueues.ledger, due)
    assert settled(q) and q.counts()["garbage"] == 0


def test_this_releases_runqueue_reads_what_the_previous_release_wrote(
    runqueues: Runqueues, redis_server: RedisServerProcess, previous_release: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": child_pythonpath(previous_release),
        "REDIS_URL": redis_server.url,
        "DRILL_QUEUE": "drill",
        "DRILL_COUNT": str(COUNT),
    }
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / "release_producer.py")],
        env=env,
        cwd=previous_release,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout.strip().splitlines()[-1])
    assert written["package"].startswith(str(previous_release))
    burst(runqueues)
    q = producer(redis_server.url, "drill")
    delivered_once(runqueues.ledger, written["due"])
    assert settled(q) and q.counts()["garbage"] == 0


def test_a_runqueue_of_the_previous_format_beside_a_new_producer_leaves_and_the_new_delivers(
    runqueues: Runqueues, redis_server: RedisServerProcess, redis_client: redis.Redis
) -> None:
    q = producer(redis_server.url, "drill")
    newer = schedule_every_kind(q, "new", format=NEW)
    readable = schedule_every_kind(q, "old")
    log = burst(runqueues, envelope_format=str(PREVIOUS))
    # It delivered what it reads and left the rest: in retry, no attempt used, none dead.
    assert sorted(d.id for d in read(runqueues.ledger)) == sorted(readable)
    assert q.counts()["retry"] == len(newer) and q.counts()["garbage"] == 0
    assert not any(redis_client.hexists(q.keys.attempts, i) for i in newer)
    said = f"wait for a consumer that reads it: this one reads formats up to {PREVIOUS}"
    assert log.count(said) == 1, log  # once, whatever it claimed after
    (stats,) = gather([q], format=NEW)
    assert stats.formats is not None and stats.formats.waiting == len(newer)
    # The new runqueue starts: it delivers each of them once, as a first attempt.
    runqueues.start()
    runqueues.wait(lambda: settled(q), 120, "the new runqueue delivering what was left")
    delivered_once(runqueues.ledger, {**newer, **readable})
    assert all(d.attempt == 1 for d in read(runqueues.ledger))
    assert q.counts()["garbage"] == 0
    (stats,) = gather([q], format=NEW)
    assert stats.formats is not None and stats.formats.waiting == 0


def test_what_the_previous_release_cannot_do_a_numbered_envelope_is_dead_there(
    runqueues: Runqueues, redis_server: RedisServerProcess, previous_release: Path
) -> None:
    """Why a producer holds a newer format back until every live consumer announces it reads
    it (core.formats.FormatGate): a runqueue of the release before formats, which announces
    none, dead-letters such an envelope (requeueable). Every later release leaves it instead."""
    q = producer(redis_server.url, "drill")
    schedule_every_kind(q, "new", format=NEW)
    burst(previous(runqueues, previous_release))
    assert q.counts()["garbage"] == 3 * COUNT
    assert read(runqueues.ledger) == []
