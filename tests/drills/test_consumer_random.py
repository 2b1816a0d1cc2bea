"""Randomized runs of real consumers over several queues (see consumer_exploration.py).

CI runs a few fixed seeds (each run takes seconds); ``DQ_EXPLORE_EXAMPLES=200`` explores with
fresh random seeds for longer, and ``DQ_EXPLORE_SEED=<seed>`` replays one that failed. Every
failure names its seed; a defect found this way becomes a named regression test.
"""

from __future__ import annotations

import pytest
import redis
from consumer_exploration import Exploration
from exploration_seeds import seeds

CI_SEEDS = [11, 23, 37, 41]


@pytest.mark.parametrize("seed", seeds(CI_SEEDS))
def test_every_message_is_accounted_for(redis_client: redis.Redis, seed: int) -> None:
    exploration = Exploration(redis_client, seed)
    exploration.run()
    exploration.check()
