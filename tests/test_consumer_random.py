"""Randomized runs of real consumers over several queues (see consumer_exploration.py).

CI runs a few fixed seeds (each run takes seconds); ``DQ_EXPLORE_EXAMPLES=200`` explores with
fresh random seeds for longer, and ``DQ_EXPLORE_SEED=<seed>`` replays one that failed. Every
failure names its seed; a defect found this way becomes a named regression test.
"""

from __future__ import annotations

import os
import random

import pytest
import redis
from consumer_exploration import Exploration

CI_SEEDS = [11, 23, 37, 41]


def _seeds() -> list[int]:
    if os.environ.get("DQ_EXPLORE_SEED"):
        return [int(os.environ["DQ_EXPLORE_SEED"])]
    if os.environ.get("DQ_EXPLORE_EXAMPLES"):
        return [random.randrange(2**32) for _ in range(int(os.environ["DQ_EXPLORE_EXAMPLES"]))]
    return CI_SEEDS


@pytest.mark.parametrize("seed", _seeds())
def test_every_message_is_accounted_for(redis_client: redis.Redis, seed: int) -> None:
    exploration = Exploration(redis_client, seed)
    exploration.run()
    exploration.check()
