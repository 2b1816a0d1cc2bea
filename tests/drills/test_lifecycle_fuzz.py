"""The lifecycle fuzzer (tests/support/lifecycle_fuzz.py): two ``runqueue --processes 2`` on a
real Redis under random handlers (quick, failing, slow, hung in ``time.sleep`` or a socket read,
a C call that holds the GIL, CPU loops, async with ``to_thread``, programs run as ``subprocess.run``
does) and random faults (``dq.abort``, live edits of ``time_limit`` and ``visibility_timeout``,
``kill -9`` of consumer processes and of a supervisor, SIGHUP after good and failed deploys).
It fails if two runs of one message ever overlapped, a message is neither acknowledged nor
dead-lettered with a reason, one started early, or an attempt is miscounted.

About a minute of fuzzing by default, with a fresh seed each run (printed, and named by every
failure). ``DQ_FUZZ_SECONDS=600`` fuzzes for ten minutes; ``DQ_FUZZ_SEED=<seed>`` replays a
run's draws; ``DQ_FUZZ_KINDS=all,-gil`` (or ``quick,socket,kill_child``) chooses the kinds
of handlers and events (the names are ``lifecycle_fuzz.KINDS``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from lifecycle_fuzz import DRAIN_SECONDS, Fuzz, FuzzConfig

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow

CONFIG = FuzzConfig.from_env()


# The bound of the whole test follows the fuzzing time: start, drain and stop are bounded too.
@pytest.mark.timeout(CONFIG.seconds + DRAIN_SECONDS + 300)
def test_no_message_ever_runs_twice_at_once_whatever_its_handler_and_the_faults(
    redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    fuzz = Fuzz(redis_server.url, redis_client, tmp_path, CONFIG)
    print(fuzz.describe())
    try:
        fuzz.run()
        print(fuzz.check())
    finally:
        fuzz.close()
