"""Randomized runs of real ``runqueue`` processes over three queues (runqueue_exploration.py).

CI runs a few fixed seeds (each run some seconds); ``DQ_EXPLORE_EXAMPLES=50`` explores with
fresh random seeds for longer, and ``DQ_EXPLORE_SEED=<seed>`` replays one that failed. Every
failure names its seed; a defect found this way becomes a named regression test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from exploration_seeds import seeds
from runqueue_exploration import Exploration

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow

# Chosen for what they draw (see Exploration.describe): 12 one runqueue on named queues (and
# "order-close") SIGTERMed with --grace 0.5 mid-handler; 18 one runqueue on every queue, no
# stop; 22 a SIGTERM with --grace 30 that waits for a sleeping handler; 150 two runqueues (every
# queue, and named ones with --concurrency 2), one given a handler back; 181 two runqueues on
# every queue, one SIGTERMed with --grace 0.5 mid-handler. About 30 s in all on 2 cores.
CI_SEEDS = [12, 18, 22, 150, 181]


@pytest.mark.parametrize("seed", seeds(CI_SEEDS))
def test_runqueue_accounts_for_every_message(
    redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path, seed: int
) -> None:
    exploration = Exploration(redis_server.url, redis_client, tmp_path, seed)
    print(exploration.describe())
    try:
        exploration.run()
        print(exploration.check())
    finally:
        exploration.close()
